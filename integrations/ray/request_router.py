"""PrefixCacheRequestRouter: Ray Serve's request router for prefixcache replicas, making the
HTTP router's decision (``RoutingPolicy.choose`` over ``PrefixIndexes``).

Serve calls ``choose_replicas`` with the candidate replicas and the pending request, whose
first argument is the ingress's ``RoutedCall`` (token ids, session). Replicas are ranked by
estimated TTFT (the policy's choice first), so when Serve finds the first one full it tries
the next best. What a replica holds is learned
* *precisely* from its KV events, once its ``record_routing_stats`` names their ZeroMQ
  addresses (a ``KVEventSubscriber`` per replica on this router's loop), or
* *approximately* until then, from the prompts routed to it.
Each replica's backlog is the prefill it was sent and has not finished (estimated seconds),
as in the HTTP router; a replica that dies is forgotten.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from typing import Any

import numpy as np
from ray.serve.request_router import (
    FIFOMixin,
    PendingRequest,
    ReplicaID,
    RequestRouter,
    RunningReplica,
)

from prefixcache.integrations.ray.replica import RoutedCall
from prefixcache.integrations.router.kv_event_subscriber import KVEventSubscriber
from prefixcache.integrations.router.prefix_indexes import PrefixIndexes
from prefixcache.integrations.router.request_tokens import affinity_key
from prefixcache.integrations.router.scoring import CostModel, RoutingPolicy

logger = logging.getLogger(__name__)

MAX_SESSIONS = 100_000


class PrefixCacheRequestRouter(FIFOMixin, RequestRouter):
    """Configured through ``RequestRouterConfig.request_router_kwargs`` (``initialize_state``)."""

    def initialize_state(
        self, policy: str = "cache_aware", prefill_tokens_per_s: float = 2000.0,
        approx_blocks: int = 65536, approx_block_size: int = 16, sticky_slack_s: float = 0.5,
        seed: int = 0,
    ) -> None:  # fmt: skip
        self.indexes = PrefixIndexes(approx_blocks, approx_block_size)
        self.policy = RoutingPolicy(policy, CostModel(1.0 / prefill_tokens_per_s), seed,
                                    sticky_slack_s)  # fmt: skip
        self.prefill_s_per_token = 1.0 / prefill_tokens_per_s
        self._slots: dict[ReplicaID, int] = {}  # a replica's number in the indexes
        self._backlog: dict[int, float] = {}
        self._in_flight: dict[str, tuple[int, float]] = {}  # request id -> (slot, seconds)
        self._sessions: OrderedDict[str, int] = OrderedDict()
        self._subscribers: dict[int, KVEventSubscriber] = {}
        self._calls: dict[str, tuple[RoutedCall, int]] = {}  # request id -> (call, cached)

    # ------------------------------------------------------------------ the decision
    async def choose_replicas(
        self, candidate_replicas: list[RunningReplica],
        pending_request: PendingRequest | None = None,
    ) -> list[list[RunningReplica]]:  # fmt: skip
        if not candidate_replicas:
            return []
        for replica in candidate_replicas:
            self._subscribe(replica)
        slots = np.array([self._slot(r.replica_id) for r in candidate_replicas])
        call = _routed_call(pending_request)
        prompt = None if call is None else call.prompt
        tokens = 0 if prompt is None else len(prompt)
        if prompt is not None and self.policy.uses_cache:
            cached = self.indexes.cached_tokens(prompt, int(slots.max()) + 1)[slots]
        else:
            cached = np.zeros(len(slots))
        backlog = np.array([self._backlog.get(int(s), 0.0) for s in slots])
        session = None if call is None else call.session
        sticky_slot = self._sessions.get(session or "")
        sticky = next((i for i, s in enumerate(slots) if s == sticky_slot), None)
        best = self.policy.choose(tokens, cached, backlog, affinity_key(session, prompt),
                                  sticky=sticky)  # fmt: skip
        if pending_request is not None and call is not None:
            self._calls[pending_request.metadata.internal_request_id] = (call, int(cached[best]))
        score = self.policy.estimated_ttft_s(tokens, cached, backlog)
        rest = [i for i in np.argsort(score, kind="stable") if i != best]
        ranks = [[candidate_replicas[best]]]
        if rest:
            ranks.append([candidate_replicas[i] for i in rest])
        return ranks

    def on_request_routed(self, pending_request: PendingRequest, replica_id: ReplicaID,
                          result: Any) -> None:  # fmt: skip
        request_id = pending_request.metadata.internal_request_id
        call, cached = self._calls.pop(request_id, (_routed_call(pending_request), 0))
        if call is None:
            return
        slot = self._slot(replica_id)
        prompt = call.prompt
        if prompt is not None:
            seconds = max(len(prompt) - cached, 0) * self.prefill_s_per_token
            self._backlog[slot] = self._backlog.get(slot, 0.0) + seconds
            self._in_flight[request_id] = (slot, seconds)
            if slot not in self._subscribers:
                self.indexes.record_routed(slot, prompt)
        if call.session:
            self._sessions[call.session] = slot
            self._sessions.move_to_end(call.session)
            if len(self._sessions) > MAX_SESSIONS:
                self._sessions.popitem(last=False)

    def on_request_completed(self, replica_id: ReplicaID, internal_request_id: str) -> None:
        slot, seconds = self._in_flight.pop(internal_request_id, (None, 0.0))
        if slot is not None:
            self._backlog[slot] = max(self._backlog.get(slot, 0.0) - seconds, 0.0)

    # ------------------------------------------------------------------ replicas
    def on_replica_actor_died(self, replica_id: ReplicaID) -> None:
        super().on_replica_actor_died(replica_id)
        self._forget(replica_id)

    def update_replicas(self, replicas: list[RunningReplica]) -> None:
        super().update_replicas(replicas)
        alive = {r.replica_id for r in replicas}
        for replica_id in [r for r in self._slots if r not in alive]:
            self._forget(replica_id)

    def routing_state(self) -> dict[str, Any]:
        """What this router knows, per replica (for logs and tests)."""
        return {replica_id.unique_id: {"slot": slot, "precise": slot in self._subscribers,
                                       "indexed_blocks": self.indexes.num_blocks(slot),
                                       "backlog_s": round(self._backlog.get(slot, 0.0), 6)}
                for replica_id, slot in self._slots.items()}  # fmt: skip

    def _slot(self, replica_id: ReplicaID) -> int:
        slot = self._slots.get(replica_id)
        if slot is None:
            used = set(self._slots.values())
            slot = next(i for i in range(len(used) + 1) if i not in used)
            self._slots[replica_id] = slot
        return slot

    def _subscribe(self, replica: RunningReplica) -> None:
        """Index ``replica`` from its events once it has said where they are."""
        slot = self._slot(replica.replica_id)
        if slot in self._subscribers:
            return
        stats = replica.routing_stats or {}
        endpoint = stats.get("kv_events")
        if not endpoint:
            return
        self.indexes.clear(slot)  # the shadow of routed prompts gives way to the real thing
        subscriber = KVEventSubscriber(slot, self.indexes, endpoint,
                                       stats.get("kv_events_replay"),
                                       stats.get("kv_events_topic") or "")  # fmt: skip
        subscriber.start()
        self._subscribers[slot] = subscriber
        logger.info("replica %s: precise index from %s", replica.replica_id.unique_id, endpoint)

    def _forget(self, replica_id: ReplicaID) -> None:
        slot = self._slots.pop(replica_id, None)
        if slot is None:
            return
        subscriber = self._subscribers.pop(slot, None)
        if subscriber is not None:
            subscriber.cancel()
        self.indexes.clear(slot)
        self._backlog.pop(slot, None)
        for session in [s for s, held in self._sessions.items() if held == slot]:
            del self._sessions[session]


def _routed_call(pending_request: PendingRequest | None) -> RoutedCall | None:
    if pending_request is None:
        return None
    for argument in pending_request.args:
        if isinstance(argument, RoutedCall):
            return argument
    return None
