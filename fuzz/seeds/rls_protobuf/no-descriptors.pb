
edge