"""Cache-aware routing over many replicas: one scoring function for the HTTP router, the Ray
Serve request router and the trace simulator (``prefixcache simulate``)."""
