
edge

path/api/v1/reports/x

path/downloads/f

path	/x/shadow