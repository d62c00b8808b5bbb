
edge

tenantfree

tenantpaid