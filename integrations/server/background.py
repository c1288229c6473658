"""Run a uvicorn server on 127.0.0.1 in a background thread (tests, notebooks, examples).

    with BackgroundServer(app) as server:
        client = openai.OpenAI(base_url=server.base_url + "/v1", api_key="none")

The socket is bound before the thread starts (port 0 picks a free port), so there is no race
between choosing a port and using it.
"""

from __future__ import annotations

import socket
import threading

import uvicorn
from fastapi import FastAPI


class BackgroundServer:
    """A uvicorn server for ``app`` on ``host``:``port`` (0: any free port), in a thread."""

    def __init__(self, app: FastAPI, host: str = "127.0.0.1", port: int = 0,
                 lifespan: str = "off") -> None:  # fmt: skip
        # IPPROTO_TCP named: asyncio sets TCP_NODELAY only on sockets whose proto says TCP,
        # and accepted sockets inherit it; with proto 0 every small response waited for a
        # delayed ACK (a /health round trip took 44 ms instead of 1 ms)
        self._socket = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        self._socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._socket.bind((host, port))
        self.host, self.port = self._socket.getsockname()[:2]
        config = uvicorn.Config(app, log_level="warning", lifespan=lifespan, timeout_keep_alive=5)
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(
            target=self._server.run, kwargs={"sockets": [self._socket]}, daemon=True,
            name=f"uvicorn-{self.port}",
        )

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self, timeout: float = 30.0) -> BackgroundServer:
        """Start serving; returns once uvicorn accepts connections."""
        self._thread.start()
        started = threading.Event()

        def wait() -> None:
            while not self._server.started and self._thread.is_alive():
                started.wait(0.01)

        waiter = threading.Thread(target=wait)
        waiter.start()
        waiter.join(timeout)
        if not self._server.started:
            raise RuntimeError("the server did not start")
        return self

    def stop(self, timeout: float = 30.0) -> None:
        """Ask uvicorn to exit, wait for the thread, close the socket."""
        self._server.should_exit = True
        self._thread.join(timeout)
        self._socket.close()

    def __enter__(self) -> BackgroundServer:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()
