editorŠ	
stories