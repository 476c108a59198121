editorb
storiesHello <s> world