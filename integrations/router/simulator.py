"""Replay a request trace against N simulated replicas, each a real ``PrefixCache`` (no model).

A replica is one FIFO server: a request waits for the work queued before it, then prefills its
uncached tokens (``CostModel.prefill_s_per_token`` each) and decodes its output
(``decode_s_per_token`` each, a batched step's share). TTFT = wait + prefill. Because a replica
serves in arrival order, the cache a request finds when it starts is the cache after every
earlier request routed there, so each replica's cache is updated at routing time, exactly.

The router sees each replica's backlog and, for ``cache_aware``, a ``ClusterIndex`` fed by the
replicas' own cache events (*precise*), or by shadow caches of what was routed to each replica
(*approximate*: ``cache_aware_approx``, capacity ``approx_blocks``). The *oracle* is one shared
cache N times as large in front of N servers, each request going to the least-loaded server.

Trace blocks are cache blocks: a replica's cache has block size 1 and its "tokens" are the
trace's block ids, so ``blocks_per_replica`` counts the trace's own blocks (512 tokens each for
Mooncake) and only a request's full blocks are ever cached or hit.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from prefixcache import PrefixCache
from prefixcache.cluster_index import ClusterIndex
from prefixcache.integrations.router.mooncake_trace import TraceRequest
from prefixcache.integrations.router.scoring import CostModel, RoutingPolicy

SIM_POLICIES = ("cache_aware", "cache_aware_approx", "session_hash", "least_load",
                "round_robin", "random")  # fmt: skip
ORACLE = "oracle"


@dataclass(frozen=True)
class SimConfig:
    """``rate_scale`` > 1 replays the trace that many times faster (more load per replica)."""

    replicas: int
    blocks_per_replica: int
    block_tokens: int = 512
    cost: CostModel = field(default_factory=CostModel)
    approx_blocks: int | None = None  # shadow capacity of cache_aware_approx; None: the pool's
    rate_scale: float = 1.0
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("replicas", "blocks_per_replica", "block_tokens"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an int >= 1, got {value!r}")
        if self.approx_blocks is not None and (
            isinstance(self.approx_blocks, bool) or not isinstance(self.approx_blocks, int)
            or self.approx_blocks < 1
        ):  # fmt: skip
            raise ValueError(f"approx_blocks must be an int >= 1, got {self.approx_blocks!r}")
        if not self.rate_scale > 0:
            raise ValueError(f"rate_scale must be > 0, got {self.rate_scale!r}")


@dataclass
class PolicyResult:
    """What one policy did to the trace: per-request TTFT, cache hits, per-server busy time."""

    name: str
    ttft_s: np.ndarray  # [num_requests] seconds
    hit_tokens: int
    query_tokens: int
    busy_s: np.ndarray  # [num_servers] seconds
    wall_s: float = 0.0

    def summary(self) -> dict[str, float]:
        p50, p90, p99 = np.percentile(self.ttft_s, [50, 90, 99]).tolist()
        mean_busy = float(self.busy_s.mean())
        return {
            "hit_rate": self.hit_tokens / self.query_tokens if self.query_tokens else 0.0,
            "ttft_p50_s": p50,
            "ttft_p90_s": p90,
            "ttft_p99_s": p99,
            "ttft_mean_s": float(self.ttft_s.mean()),
            "imbalance": float(self.busy_s.max()) / mean_busy if mean_busy else 1.0,
            "wall_s": self.wall_s,
        }


def cache_prompt(cache: PrefixCache, blocks: np.ndarray) -> int:
    """Serve ``blocks`` (block ids as size-1 blocks) on ``cache``: returns how many leading
    blocks were cached already, then caches as many of the rest as the pool can hold."""
    hit = cache.match(blocks)
    held = len(hit.block_ids)
    room = min(len(blocks) - held, cache.num_blocks - held)
    fresh = cache.allocate(room) if room > 0 else []
    if fresh:
        cache.insert(blocks[: held + room], hit.block_ids + fresh)
    cache.release(hit.block_ids + fresh)
    return held


class _Servers:
    """N FIFO servers: when each is next free and how long each has worked."""

    def __init__(self, n: int, cost: CostModel) -> None:
        self.free_at = np.zeros(n)
        self.busy_s = np.zeros(n)
        self.cost = cost

    def backlog(self, now: float) -> np.ndarray:  # [n] seconds of queued work
        return np.maximum(self.free_at - now, 0.0)

    def run(self, server: int, now: float, uncached: int, output: int) -> float:
        """Queue a request on ``server``; returns its TTFT."""
        prefill = uncached * self.cost.prefill_s_per_token
        start = max(now, float(self.free_at[server]))
        work = prefill + output * self.cost.decode_s_per_token
        self.free_at[server] = start + work
        self.busy_s[server] += work
        return start - now + prefill


def _affinity_key(request: TraceRequest, number: int) -> int:
    return int(request.blocks[0]) if len(request.blocks) else 2**40 + number


def simulate(
    trace: Sequence[TraceRequest], config: SimConfig, policy_name: str
) -> PolicyResult:
    """Route every request of ``trace`` with ``policy_name`` (one of SIM_POLICIES or ORACLE)."""
    started = time.perf_counter()
    if policy_name == ORACLE:
        result = _simulate_oracle(trace, config)
    elif policy_name in SIM_POLICIES:
        result = _simulate_policy(trace, config, policy_name)
    else:
        raise ValueError(f"unknown policy {policy_name!r}; choose from {(*SIM_POLICIES, ORACLE)}")
    result.wall_s = time.perf_counter() - started
    return result


def _simulate_policy(
    trace: Sequence[TraceRequest], config: SimConfig, policy_name: str
) -> PolicyResult:
    n, bt = config.replicas, config.block_tokens
    approx = policy_name == "cache_aware_approx"
    policy = RoutingPolicy("cache_aware" if approx else policy_name, config.cost, config.seed)
    caches = [PrefixCache(config.blocks_per_replica, 1, enable_events=not approx)
              for _ in range(n)]  # fmt: skip
    shadow = [PrefixCache(config.approx_blocks or config.blocks_per_replica, 1,
                          enable_events=True) for _ in range(n)] if approx else []  # fmt: skip
    index = ClusterIndex(1) if policy.uses_cache else None
    events_of = shadow if approx else caches
    servers = _Servers(n, config.cost)
    ttft = np.zeros(len(trace))
    hit_tokens = query_tokens = 0
    for number, request in enumerate(trace):
        now = request.arrival_s / config.rate_scale
        cached = np.zeros(n)
        if index is not None:
            for backend, blocks in index.match(index.prompt_hashes(request.blocks)).items():
                cached[backend] = blocks * bt
        chosen = policy.choose(request.input_length, cached, servers.backlog(now),
                               _affinity_key(request, number))  # fmt: skip
        held = cache_prompt(caches[chosen], request.blocks)
        if approx:
            cache_prompt(shadow[chosen], request.blocks)
        if index is not None:
            index.apply_all(chosen, events_of[chosen].drain_events())
        ttft[number] = servers.run(chosen, now, request.input_length - held * bt,
                                   request.output_length)  # fmt: skip
        hit_tokens += held * bt
        query_tokens += request.input_length
    return PolicyResult(policy_name, ttft, hit_tokens, query_tokens, servers.busy_s)


def _simulate_oracle(trace: Sequence[TraceRequest], config: SimConfig) -> PolicyResult:
    n, bt = config.replicas, config.block_tokens
    cache = PrefixCache(config.blocks_per_replica * n, 1)
    servers = _Servers(n, config.cost)
    ttft = np.zeros(len(trace))
    hit_tokens = query_tokens = 0
    for number, request in enumerate(trace):
        now = request.arrival_s / config.rate_scale
        chosen = int(np.argmin(servers.free_at))
        held = cache_prompt(cache, request.blocks)
        ttft[number] = servers.run(chosen, now, request.input_length - held * bt,
                                   request.output_length)  # fmt: skip
        hit_tokens += held * bt
        query_tokens += request.input_length
    return PolicyResult(ORACLE, ttft, hit_tokens, query_tokens, servers.busy_s)


def working_set_blocks(trace: Sequence[TraceRequest]) -> int:
    """Distinct full blocks of the trace: the pool that would hold all of it."""
    seen: set[int] = set()
    for request in trace:
        seen.update(request.blocks.tolist())
    return len(seen)


def simulate_all(
    trace: Sequence[TraceRequest],
    config: SimConfig,
    policies: Sequence[str],
    progress: Callable[[str], None] | None = None,
) -> dict[str, PolicyResult]:
    """Every policy of ``policies`` (oracle included if named) on the same trace and config."""
    results = {}
    for name in policies:
        if progress is not None:
            progress(name)
        results[name] = simulate(trace, config, name)
    return results
