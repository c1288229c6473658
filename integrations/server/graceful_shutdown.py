"""Graceful shutdown for ``prefixcache serve``: drain on SIGTERM, bounded by a deadline.

On the first SIGTERM (or SIGINT) the server stops accepting connections, answers 503
``server_shutting_down`` to new requests on open ones (and on ``/health``, so a load balancer
takes it out), and lets the requests in flight finish for at most ``shutdown_timeout``
seconds. Then it aborts the rest: their blocks are released and each client gets a final
error (an SSE error event before ``data: [DONE]`` on a stream, a 503 otherwise); the server
exits with status 0 once their connections close. A second signal exits at once (the serve
command then exits with status 1).
"""

from __future__ import annotations

import asyncio
import logging
import socket
from types import FrameType

import uvicorn

from prefixcache.integrations.server.state import ServerState

logger = logging.getLogger(__name__)
BACKSTOP_SECONDS = 5.0  # past the deadline, uvicorn cancels whatever still has not ended
ABORT_REASON = "the server shut down before this request finished"


class DrainingServer(uvicorn.Server):
    """A uvicorn server that drains ``state``'s engine on shutdown (module docstring)."""

    def __init__(self, config: uvicorn.Config, state: ServerState,
                 shutdown_timeout: float) -> None:
        if not shutdown_timeout >= 0:
            raise ValueError(f"shutdown_timeout must be >= 0, got {shutdown_timeout}")
        config.timeout_graceful_shutdown = int(shutdown_timeout + BACKSTOP_SECONDS)
        super().__init__(config)
        self.state = state
        self.shutdown_timeout = shutdown_timeout
        self.aborted_requests = 0

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        """First signal: drain. Second: exit now. (Signals are not re-raised after the
        shutdown, as uvicorn does by default, so a drained server exits with status 0.)"""
        if self.should_exit:
            logger.warning("second shutdown signal: exiting without waiting")
            self.force_exit = True
        else:
            self.should_exit = True

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        self.state.draining = True
        in_flight = self.state.admission.in_flight
        logger.info("draining: %d requests in flight, at most %gs", in_flight,
                    self.shutdown_timeout)
        deadline = asyncio.ensure_future(self._abort_after_deadline())
        try:
            await super().shutdown(sockets)
        finally:
            deadline.cancel()
        stats = await self.state.engine.call(lambda llm: llm.stats())
        logger.info("shut down: %d requests aborted at the deadline; KV blocks in use: %d",
                    self.aborted_requests, stats["in_use"])

    async def _abort_after_deadline(self) -> None:
        await asyncio.sleep(self.shutdown_timeout)
        self.aborted_requests = await self.state.engine.abort_all(ABORT_REASON)
        logger.warning("shutdown deadline (%gs) passed: aborted %d requests",
                       self.shutdown_timeout, self.aborted_requests)
