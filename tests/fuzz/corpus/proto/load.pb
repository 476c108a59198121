editorz	
stories