

useralice