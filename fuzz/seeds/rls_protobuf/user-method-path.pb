
edge,

useralice

methodGET

path/a/b