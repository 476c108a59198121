editor‚	
stories