
edge

useralice

planpremium