editorZ
storiesOnce upon a time