
edge

useralice

methodPOST

userbob