"""`prefixcache bench`: seeded, token-exact workloads replayed against in-process engines or
OpenAI-compatible URLs, with TTFT-centric metrics, a terminal table, JSON, CSV and PNG plots."""
