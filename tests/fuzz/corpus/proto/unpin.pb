editor’	
stories