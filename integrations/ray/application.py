"""The Serve application: ``PrefixCacheIngress`` -> N ``PrefixCacheReplica`` routed by
``PrefixCacheRequestRouter``.

Python: ``serve.run(prefixcache_app(model="smollm2", num_replicas=4))``. A config file for
``serve run`` / ``serve deploy`` names ``prefixcache.integrations.ray:build_app`` with the
same options as ``args`` (see docs/router.md).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from ray import serve
from ray.serve import Application
from ray.serve.config import RequestRouterConfig

from prefixcache.integrations.ray.ingress import PrefixCacheIngress
from prefixcache.integrations.ray.replica import PrefixCacheReplica
from prefixcache.integrations.ray.request_router import PrefixCacheRequestRouter
from prefixcache.integrations.router.scoring import ROUTING_POLICIES


@dataclass
class RayAppOptions:
    """``llm``: ``AsyncLLM`` options of every replica (``num_blocks``, ``block_size``, ``dtype``,
    ``max_model_len``...); ``env``: environment of the replicas' processes (e.g.
    ``OMP_NUM_THREADS``); ``routing_stats_period_s``: how often Serve asks replicas where
    their KV events are (a new replica is routed approximately until then)."""

    model: str = "smollm2"
    served_model_name: str | None = None
    num_replicas: int = 2
    num_cpus_per_replica: float = 1.0
    max_ongoing_requests: int = 32
    policy: str = "cache_aware"
    prefill_tokens_per_s: float = 2000.0
    routing_stats_period_s: float = 1.0
    llm: dict[str, Any] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.model, str) or not self.model:
            raise ValueError(f"model must be a model spec string, got {self.model!r}")
        for name in ("num_replicas", "max_ongoing_requests"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an int >= 1, got {value!r}")
        for name in ("num_cpus_per_replica", "prefill_tokens_per_s", "routing_stats_period_s"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
                raise ValueError(f"{name} must be a number >= 0, got {value!r}")
        if self.policy not in ROUTING_POLICIES:
            raise ValueError(f"unknown routing policy {self.policy!r}; choose from "
                             f"{', '.join(ROUTING_POLICIES)}")  # fmt: skip
        if not isinstance(self.llm, Mapping) or not isinstance(self.env, Mapping):
            raise ValueError("llm and env must be mappings")

    @classmethod
    def from_args(cls, args: Mapping[str, Any]) -> RayAppOptions:
        """From a ``serve run`` config's ``args`` (numbers may come as strings)."""
        known = {f.name: f for f in fields(cls)}
        unknown = sorted(set(args) - set(known))
        if unknown:
            raise ValueError(f"unknown option(s) {', '.join(unknown)}; known: "
                             f"{', '.join(sorted(known))}")  # fmt: skip
        values = dict(args)
        for name in ("num_replicas", "max_ongoing_requests"):
            if isinstance(values.get(name), str):
                values[name] = int(values[name])
        for name in ("num_cpus_per_replica", "prefill_tokens_per_s", "routing_stats_period_s"):
            if isinstance(values.get(name), str):
                values[name] = float(values[name])
        return cls(**values)


def prefixcache_app(**options: Any) -> Application:
    """The application for ``serve.run``; options as ``RayAppOptions``."""
    return build_app(options)


def build_app(args: Mapping[str, Any]) -> Application:
    """The application builder ``serve run`` calls with the config's ``args``."""
    config = RayAppOptions.from_args(args)
    router = RequestRouterConfig(
        request_router_class=PrefixCacheRequestRouter,
        request_router_kwargs={"policy": config.policy,
                               "prefill_tokens_per_s": config.prefill_tokens_per_s},
        request_routing_stats_period_s=config.routing_stats_period_s,
    )
    actor_options: dict[str, Any] = {"num_cpus": config.num_cpus_per_replica}
    if config.env:
        actor_options["runtime_env"] = {"env_vars": {k: str(v) for k, v in config.env.items()}}
    replicas = serve.deployment(
        PrefixCacheReplica, name="PrefixCacheReplica", num_replicas=config.num_replicas,
        max_ongoing_requests=config.max_ongoing_requests, ray_actor_options=actor_options,
        request_router_config=router,
    ).bind(config.model, config.served_model_name, dict(config.llm))
    ingress = serve.deployment(PrefixCacheIngress, name="PrefixCacheIngress",
                               ray_actor_options={"num_cpus": 0})  # fmt: skip
    return ingress.bind(replicas, config.model)


__all__ = ["RayAppOptions", "build_app", "prefixcache_app"]
