
api

	client_idc'

	client_idc

	operationsell"

	client_idc

	operationbuy