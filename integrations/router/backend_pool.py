"""The router's backends: health, load, and where their cache events come from.

A health loop asks every backend's ``/health`` each ``health_interval_s`` (with that as its
timeout), so a dead backend is out within about twice that; a failed forward takes it out at
once. Out means: never routed to, its index forgotten, its event subscription stopped. When
it answers again it rejoins: a backend that advertises ``GET /kv_events`` (ours with
``--kv-events``), or one given events by hand (vLLM with ``--kv-events-config``), is indexed
*precisely* from its events; any other is indexed *approximately* from what was routed there.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass, field
from urllib.parse import urlsplit

import httpx
import numpy as np

from prefixcache.integrations.router.kv_event_subscriber import KVEventSubscriber
from prefixcache.integrations.router.prefix_indexes import PrefixIndexes

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class EventSource:
    """Where a backend publishes KV events."""

    endpoint: str
    replay_endpoint: str | None = None
    topic: str = ""


@dataclass
class Backend:
    """One backend and what the router knows of it. ``backlog_s``: estimated prefill seconds
    of requests sent there that have not started answering."""

    number: int
    url: str
    events: EventSource | None = None  # given by hand; else discovered at each (re)join
    healthy: bool = False
    precise: bool = False
    in_flight: int = 0
    backlog_s: float = 0.0
    routed: int = 0
    failures: int = 0
    subscriber: KVEventSubscriber | None = field(default=None, repr=False)

    def to_json(self, indexes: PrefixIndexes) -> dict[str, object]:
        return {"url": self.url, "healthy": self.healthy,
                "index": "precise" if self.precise else "approximate",
                "indexed_blocks": indexes.num_blocks(self.number), "in_flight": self.in_flight,
                "backlog_s": round(self.backlog_s, 6), "routed": self.routed,
                "failures": self.failures}  # fmt: skip


class BackendPool:
    """The backends, their health loop and their indexes (``indexes``)."""

    def __init__(
        self,
        urls: list[str],
        client: httpx.AsyncClient,
        indexes: PrefixIndexes,
        events: dict[str, EventSource] | None = None,
        health_interval_s: float = 0.5,
    ) -> None:
        if not urls:
            raise ValueError("give at least one backend")
        clean = [url.rstrip("/") for url in urls]
        for url in clean:
            if urlsplit(url).scheme not in ("http", "https") or not urlsplit(url).netloc:
                raise ValueError(f"backend {url!r} is not an http(s) URL")
        if len(set(clean)) != len(clean):
            raise ValueError("a backend is listed twice")
        given = {url.rstrip("/"): source for url, source in (events or {}).items()}
        unknown = set(given) - set(clean)
        if unknown:
            raise ValueError(f"events given for {sorted(unknown)[0]!r}, which is no backend")
        self.backends = [Backend(i, url, given.get(url)) for i, url in enumerate(clean)]
        self.client = client
        self.indexes = indexes
        self.health_interval_s = health_interval_s
        self._task: asyncio.Task | None = None

    def healthy_mask(self) -> np.ndarray:  # [n] bool
        return np.array([b.healthy for b in self.backends], dtype=bool)

    def backlog(self) -> np.ndarray:  # [n] seconds
        return np.array([b.backlog_s for b in self.backends])

    async def start(self) -> None:
        """Check every backend once, then keep checking in the background."""
        await self.check_all()
        self._task = asyncio.get_running_loop().create_task(self._loop())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        for backend in self.backends:
            await self._unsubscribe(backend)

    async def check_all(self) -> None:
        await asyncio.gather(*(self._check(b) for b in self.backends))

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self.health_interval_s)
            await self.check_all()

    async def _check(self, backend: Backend) -> None:
        try:
            response = await self.client.get(f"{backend.url}/health",
                                             timeout=self.health_interval_s)  # fmt: skip
            alive = response.status_code == 200
        except httpx.HTTPError:
            alive = False
        if alive and not backend.healthy:
            await self._join(backend)
        elif not alive and backend.healthy:
            await self.mark_down(backend, "its /health check failed")

    async def mark_down(self, backend: Backend, reason: str) -> None:
        """Take ``backend`` out now: no more requests, its index forgotten."""
        if not backend.healthy:
            return
        backend.healthy = False
        backend.failures += 1
        await self._unsubscribe(backend)
        forgotten = self.indexes.clear(backend.number)
        logger.warning("backend %s is out (%s); %d indexed blocks dropped", backend.url,
                       reason, forgotten)  # fmt: skip

    async def _join(self, backend: Backend) -> None:
        source = backend.events or await self._discover_events(backend)
        backend.precise = source is not None
        if source is not None:
            subscriber = KVEventSubscriber(backend.number, self.indexes, source.endpoint,
                                           source.replay_endpoint, source.topic)  # fmt: skip
            subscriber.start()
            backend.subscriber = subscriber
        backend.backlog_s = 0.0
        backend.healthy = True
        logger.info("backend %s joined (%s index)", backend.url,
                    "precise" if backend.precise else "approximate")  # fmt: skip

    async def _discover_events(self, backend: Backend) -> EventSource | None:
        try:
            response = await self.client.get(f"{backend.url}/kv_events",
                                             timeout=self.health_interval_s * 4)  # fmt: skip
            if response.status_code != 200:
                return None
            info = response.json()
            host = urlsplit(backend.url).hostname or "127.0.0.1"
            return EventSource(_reachable(info["endpoint"], host),
                               _reachable(info.get("replay_endpoint"), host),
                               info.get("topic", ""))  # fmt: skip
        except (httpx.HTTPError, ValueError, KeyError, TypeError):
            return None

    async def _unsubscribe(self, backend: Backend) -> None:
        if backend.subscriber is not None:
            await backend.subscriber.stop()
            backend.subscriber = None


def _reachable(endpoint: str | None, host: str) -> str | None:
    """A wildcard bind address (``tcp://*:5557``, ``tcp://0.0.0.0:5557``) as the backend's
    host."""
    if endpoint is None:
        return None
    for wildcard in ("tcp://*:", "tcp://0.0.0.0:", "tcp://[::]:"):
        if endpoint.startswith(wildcard):
            return f"tcp://{host}:{endpoint[len(wildcard):]}"
    return endpoint
