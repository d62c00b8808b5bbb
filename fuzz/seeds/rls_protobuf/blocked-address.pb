
edge

remote_address
192.0.2.66

remote_address	127.0.0.1