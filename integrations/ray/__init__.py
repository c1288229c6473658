"""prefixcache on Ray Serve: N engine replicas behind an OpenAI ingress, routed by what each
one holds (``PrefixCacheRequestRouter``, the HTTP router's decision). Needs ``ray[serve]``
(``pip install 'prefixcache[ray]'``).

    from ray import serve
    from prefixcache.integrations.ray import prefixcache_app
    serve.run(prefixcache_app(model="smollm2", num_replicas=4), route_prefix="/")
"""

from prefixcache.integrations.ray.application import RayAppOptions, build_app, prefixcache_app
from prefixcache.integrations.ray.ingress import PrefixCacheIngress
from prefixcache.integrations.ray.replica import PrefixCacheReplica, RoutedCall
from prefixcache.integrations.ray.request_router import PrefixCacheRequestRouter

__all__ = [
    "PrefixCacheIngress",
    "PrefixCacheReplica",
    "PrefixCacheRequestRouter",
    "RayAppOptions",
    "RoutedCall",
    "build_app",
    "prefixcache_app",
]
