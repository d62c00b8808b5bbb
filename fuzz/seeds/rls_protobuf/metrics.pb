
edge

regioneu


zonez1

regionus
	
zonea