
edge

useralice€€€€€€€€€

useraliceÿÿÿÿÿÿÿÿÿÿÿÿÿ