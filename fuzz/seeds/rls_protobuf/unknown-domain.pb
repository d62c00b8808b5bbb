
nope

useralice