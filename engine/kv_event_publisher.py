"""KVEventPublisher: the cache's events out over ZeroMQ, as vLLM publishes its own.

Messages on the PUB socket are three frames ``(topic, seq, payload)``: ``seq`` an 8-byte
big-endian counter from 0, ``payload`` one batch of ``prefixcache.event_wire``. A subscriber
that sees a gap asks the optional replay socket (ROUTER) for every batch from a sequence
number on: it sends the 8-byte number and gets ``(seq, payload)`` frames for the batches
still buffered, then ``(-1, b"")``. The first batch after a start is ``AllBlocksCleared``, so
a subscriber that knew an earlier run of this server forgets it (a sequence number going back
means the same).

The cache hands events to ``__call__`` on the engine's thread (a deque append); a thread of
this publisher sends what gathered every ``batch_window_s`` and answers replays, so the engine
never waits on the network.
"""

from __future__ import annotations

import atexit
import collections
import logging
import threading
import time

import zmq

from prefixcache.event_wire import encode_batch
from prefixcache.events import AllBlocksCleared, CacheEvent

logger = logging.getLogger(__name__)

END_OF_REPLAY = (-1).to_bytes(8, "big", signed=True)
ENDPOINT_SCHEMES = ("tcp://", "ipc://", "inproc://")
MAX_EVENTS_PER_BATCH = 1024


def check_endpoint(name: str, endpoint: object) -> str:
    """``endpoint`` if it is a ZeroMQ address string (tcp://, ipc://, inproc://)."""
    if not isinstance(endpoint, str):
        raise TypeError(f"{name} must be a ZeroMQ endpoint string, got {type(endpoint).__name__}")
    if not endpoint.startswith(ENDPOINT_SCHEMES):
        raise ValueError(f"{name}={endpoint!r} is not a ZeroMQ endpoint such as "
                         "tcp://127.0.0.1:5557")  # fmt: skip
    return endpoint


def check_kv_events(endpoint: object, replay: object, names: tuple[str, str] = (
        "kv_events", "kv_events_replay")) -> None:  # fmt: skip
    """The publisher's options as given (``names``: how the caller calls them): endpoints, and
    no replay socket without events."""
    if endpoint is not None:
        check_endpoint(names[0], endpoint)
    if replay is not None:
        if endpoint is None:
            raise ValueError(f"{names[1]} needs {names[0]}")
        check_endpoint(names[1], replay)


class KVEventPublisher:
    """Binds ``endpoint`` (and ``replay_endpoint``) now: a busy port or a bad address raises
    ValueError here, before any event. ``buffer_batches`` batches are kept for replay."""

    def __init__(
        self,
        endpoint: str,
        replay_endpoint: str | None = None,
        topic: str = "",
        buffer_batches: int = 10_000,
        batch_window_s: float = 0.005,
    ) -> None:
        check_endpoint("kv_events", endpoint)
        if replay_endpoint is not None:
            check_endpoint("kv_events_replay", replay_endpoint)
        if not isinstance(topic, str):
            raise TypeError(f"kv_events_topic must be a str, got {type(topic).__name__}")
        self.topic = topic
        self._context = zmq.Context()
        self._pub = self._context.socket(zmq.PUB)
        self._pub.set_hwm(100_000)
        self._replay: zmq.Socket | None = None
        try:
            self.endpoint = self._bind(self._pub, endpoint)
            self.replay_endpoint: str | None = None
            if replay_endpoint is not None:
                self._replay = self._context.socket(zmq.ROUTER)
                self.replay_endpoint = self._bind(self._replay, replay_endpoint)
        except ValueError:
            self._close_sockets()
            raise
        self._pending: collections.deque[CacheEvent] = collections.deque([AllBlocksCleared()])
        self._sent: collections.deque[tuple[int, bytes]] = collections.deque(
            maxlen=buffer_batches
        )
        self._window_s = batch_window_s
        self.next_seq = 0
        self.events_queued = 1  # the AllBlocksCleared above
        self.events_sent = 0
        self._sent_changed = threading.Condition()
        self.replays_served = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="kv-events", daemon=True)
        self._thread.start()
        atexit.register(self.close)

    def __call__(self, event: CacheEvent) -> None:
        """Queue one event (the cache's listener; called on the engine's thread)."""
        self.events_queued += 1
        self._pending.append(event)

    def wait_sent(self, timeout_s: float = 10.0) -> bool:
        """Wait until every event queued so far is published; False on timeout."""
        target = self.events_queued
        with self._sent_changed:
            return self._sent_changed.wait_for(lambda: self.events_sent >= target, timeout_s)

    def close(self, timeout_s: float = 2.0) -> None:
        """Send what is queued, then stop the thread and close the sockets (idempotent)."""
        if self._stop.is_set():
            return
        self._stop.set()
        self._thread.join(timeout=timeout_s)
        self._close_sockets()
        atexit.unregister(self.close)

    def _bind(self, socket: zmq.Socket, endpoint: str) -> str:
        try:
            socket.bind(endpoint)
        except zmq.ZMQError as error:
            raise ValueError(f"cannot bind KV events endpoint {endpoint!r}: {error}") from None
        return socket.getsockopt_string(zmq.LAST_ENDPOINT)

    def _close_sockets(self) -> None:
        for socket in (self._pub, self._replay):
            if socket is not None:
                socket.close(linger=200)
        self._context.term()

    # ------------------------------------------------------------------ publisher thread
    def _run(self) -> None:
        poller = zmq.Poller()
        if self._replay is not None:
            poller.register(self._replay, zmq.POLLIN)
        while True:
            stopping = self._stop.is_set()
            try:
                if self._replay is not None:
                    if poller.poll(timeout=0 if stopping else self._window_s * 1000):
                        self._serve_replay()
                elif not stopping:
                    time.sleep(self._window_s)
                while self._pending:
                    self._send_batch()
            except Exception:  # the engine must never stop for its event stream
                logger.exception("publishing KV events failed")
                time.sleep(0.1)
            if stopping:
                return

    def _send_batch(self) -> None:
        events = []
        while self._pending and len(events) < MAX_EVENTS_PER_BATCH:
            events.append(self._pending.popleft())
        payload = encode_batch(events, time.time())
        seq = self.next_seq
        self._pub.send_multipart((self.topic.encode(), seq.to_bytes(8, "big"), payload))
        self._sent.append((seq, payload))
        self.next_seq = seq + 1
        with self._sent_changed:
            self.events_sent += len(events)
            self._sent_changed.notify_all()

    def _serve_replay(self) -> None:
        assert self._replay is not None
        frames = self._replay.recv_multipart()
        if len(frames) != 3 or len(frames[2]) != 8:
            logger.warning("ignoring a malformed KV events replay request (%d frames)",
                           len(frames))  # fmt: skip
            return
        client, _, start = frames
        first = int.from_bytes(start, "big")
        for seq, payload in list(self._sent):
            if seq >= first:
                self._replay.send_multipart((client, b"", seq.to_bytes(8, "big"), payload))
        self._replay.send_multipart((client, b"", END_OF_REPLAY, b""))
        self.replays_served += 1
