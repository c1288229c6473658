"""KVEventSubscriber: one backend's KV events (ours or vLLM's) folded into a ClusterIndex.

Runs as an asyncio task on the router's loop (``zmq.asyncio``), so the index is only ever
touched from that loop. Sequence numbers keep the index exact:
* a gap (``seq > last + 1``) asks the replay socket for ``last + 1`` on before going on;
* the first batch seen, if not ``seq 0``, asks for everything from 0 (blocks the backend
  cached before the router started);
* a sequence number that goes back means the backend restarted: its index is cleared.
Batches the backend no longer buffers are lost; their blocks are ``orphan_blocks`` of the
index and only cost misses.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterable
from typing import Protocol

import zmq
import zmq.asyncio

from prefixcache.cluster_index import BackendId
from prefixcache.event_wire import KVEventDecodeError, decode_batch
from prefixcache.events import CacheEvent

logger = logging.getLogger(__name__)


class EventSink(Protocol):
    """What the subscriber feeds: a ``ClusterIndex`` or the router's ``PrefixIndexes``."""

    def apply_all(self, backend: BackendId, events: Iterable[CacheEvent]) -> None: ...

    def clear(self, backend: BackendId) -> int: ...

REPLAY_TIMEOUT_S = 2.0


class KVEventSubscriber:
    """Subscribe to ``endpoint`` (topic ``topic``) and apply every batch to ``index`` under
    ``backend``; ``replay_endpoint`` (optional) fills gaps."""

    def __init__(
        self,
        backend: BackendId,
        index: EventSink,
        endpoint: str,
        replay_endpoint: str | None = None,
        topic: str = "",
        context: zmq.asyncio.Context | None = None,
    ) -> None:
        self.backend = backend
        self.index = index
        self.endpoint = endpoint
        self.replay_endpoint = replay_endpoint
        self.topic = topic
        self._context = context or zmq.asyncio.Context.instance()
        self.last_seq = -1
        self.batches = 0
        self.replayed_batches = 0
        self.restarts = 0
        self.decode_errors = 0
        self._task: asyncio.Task | None = None
        self.connected = asyncio.Event()

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    def cancel(self) -> None:
        """Stop without waiting for the task to end (from synchronous code on the loop)."""
        if self._task is not None:
            self._task.cancel()
            self._task = None

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def _run(self) -> None:
        sub = self._context.socket(zmq.SUB)
        sub.setsockopt(zmq.LINGER, 0)
        sub.setsockopt(zmq.SUBSCRIBE, self.topic.encode())
        sub.connect(self.endpoint)
        self.connected.set()
        try:
            while True:
                frames = await sub.recv_multipart()
                if len(frames) != 3 or len(frames[1]) != 8:
                    self.decode_errors += 1
                    continue
                await self.receive(int.from_bytes(frames[1], "big"), frames[2])
        finally:
            sub.close()

    async def receive(self, seq: int, payload: bytes) -> None:
        """Apply one published batch, replaying what was missed first."""
        if seq <= self.last_seq:
            if seq == self.last_seq:
                return  # a duplicate
            self.restarts += 1
            self.index.clear(self.backend)
            self.last_seq = -1
        if seq > self.last_seq + 1 and self.replay_endpoint is not None:
            await self._replay(self.last_seq + 1, seq)
        self._apply(seq, payload)

    def _apply(self, seq: int, payload: bytes) -> None:
        try:
            _, events = decode_batch(payload)
        except KVEventDecodeError as error:
            self.decode_errors += 1
            logger.warning("backend %s sent an unreadable KV event batch: %s", self.backend,
                           error)  # fmt: skip
        else:
            self.index.apply_all(self.backend, events)
        self.last_seq = seq
        self.batches += 1

    async def _replay(self, first: int, before: int) -> None:
        """Batches ``first .. before - 1`` from the replay socket (those still buffered)."""
        assert self.replay_endpoint is not None
        dealer = self._context.socket(zmq.DEALER)
        dealer.setsockopt(zmq.LINGER, 0)
        dealer.connect(self.replay_endpoint)
        try:
            await dealer.send_multipart((b"", first.to_bytes(8, "big")))
            while True:
                frames = await asyncio.wait_for(dealer.recv_multipart(), REPLAY_TIMEOUT_S)
                if len(frames) != 3 or not frames[2]:
                    return  # the end marker (or a malformed reply)
                seq = int.from_bytes(frames[1], "big", signed=True)
                if self.last_seq < seq < before:
                    self._apply(seq, frames[2])
                    self.replayed_batches += 1
        except asyncio.TimeoutError:
            logger.warning("backend %s did not answer a KV events replay", self.backend)
        finally:
            dealer.close()
