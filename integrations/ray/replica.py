"""PrefixCacheReplica: one engine (``AsyncLLM``) behind prefixcache's OpenAI app, as a Serve
deployment's replica.

``call(RoutedCall)`` answers one request through the app in this process and streams it back
to the ingress: first a ``ReplyHead`` (status, headers, which replica), then the body's chunks
as the app sends them, so token streaming, usage and errors are the server's own. The engine
publishes its KV events on ZeroMQ ports it picks itself; ``record_routing_stats`` hands their
addresses to the request router, whose index of this replica is then precise.
"""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from prefixcache.integrations.ray.asgi_call import call_asgi

REPLICA_HEADER = "x-prefixcache-replica"


@dataclass(frozen=True)
class RoutedCall:
    """One OpenAI request as the ingress hands it on: the request router reads ``prompt`` (its
    token ids, None when uncountable) and ``session``; the replica replays ``body`` at
    ``path``."""

    path: str
    body: bytes
    headers: tuple[tuple[str, str], ...]
    prompt: np.ndarray | None  # [tokens] int32
    session: str | None


@dataclass(frozen=True)
class ReplyHead:
    status: int
    headers: list[tuple[str, str]]
    replica: str


class PrefixCacheReplica:
    """``model`` and ``llm_options`` as ``AsyncLLM`` takes them; ``served_model_name`` is the
    name clients pass as ``model`` (default: ``model``)."""

    def __init__(self, model: str, served_model_name: str | None = None,
                 llm_options: dict[str, Any] | None = None) -> None:  # fmt: skip
        from prefixcache.engine import AsyncLLM
        from prefixcache.integrations.server import build_app

        host = _node_ip()
        options = {"kv_events": f"tcp://{host}:*", "kv_events_replay": f"tcp://{host}:*",
                   **(llm_options or {})}  # fmt: skip
        self.engine = AsyncLLM(model=model, **options)
        self.app = build_app(self.engine, model_name=served_model_name or model)
        self.replica = _replica_name()

    async def call(self, routed: RoutedCall) -> AsyncIterator[ReplyHead | bytes]:
        reply = await call_asgi(self.app, "POST", routed.path, routed.headers, routed.body)
        yield ReplyHead(reply.status, [*reply.headers, (REPLICA_HEADER, self.replica)],
                        self.replica)  # fmt: skip
        async for chunk in reply.body:
            yield chunk

    async def get(self, path: str) -> tuple[int, bytes]:
        """A GET on the app (``/v1/models``, ``/health``, ``/metrics``)."""
        reply = await call_asgi(self.app, "GET", path, (), b"")
        return reply.status, b"".join([chunk async for chunk in reply.body])

    def record_routing_stats(self) -> dict[str, Any]:
        """Polled by Serve for the request router: where this replica's KV events are."""
        publisher = self.engine.llm.kv_events
        if publisher is None:
            return {}
        return {"kv_events": publisher.endpoint, "kv_events_replay": publisher.replay_endpoint,
                "kv_events_topic": publisher.topic}  # fmt: skip

    def check_health(self) -> None:
        """Serve's health check: raises once the engine's worker has died."""
        self.engine.raise_if_dead()

    def __del__(self) -> None:
        engine = getattr(self, "engine", None)
        if engine is not None:
            engine.shutdown()


def _node_ip() -> str:
    try:
        import ray

        return ray.util.get_node_ip_address()
    except Exception:  # outside Ray (tests of the class alone)
        return socket.gethostbyname("localhost")


def _replica_name() -> str:
    try:
        from ray import serve

        return serve.get_replica_context().replica_id.unique_id
    except Exception:
        return socket.gethostname()
