"""`prefixcache serve` on SIGTERM: stop accepting, let requests in flight finish within
--shutdown-timeout, abort the rest with a final error event, release every block, exit 0;
a second SIGTERM exits at once."""

from __future__ import annotations

import json
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from integration_helpers import CLI, subprocess_env
from tiny_model_factory import make_tiny_model_dir

from prefixcache.integrations.server.server_process import free_port, wait_until_healthy

CONTEXT = 32768
SHUTDOWN_TIMEOUT_S = 15.0
# A step of the tiny model takes about a millisecond on 2 idle cores (up to 90 ms when another
# process keeps both busy): SHORT is still streaming when the signal follows its first token,
# and ends well inside the timeout; LONG (4 samples of 32 K tokens) would run for a minute.
SHORT = {"prompt": [1, 2, 3], "max_tokens": 100}
LONG = {"prompt": [4, 5, 6], "max_tokens": CONTEXT - 8, "n": 4}


@pytest.fixture(scope="module")
def long_context_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_model_dir(tmp_path_factory.mktemp("tiny-32k"), "llama",
                               max_position_embeddings=CONTEXT)


class Stream:
    """A streamed completion read in a thread: its SSE events, and when the first arrived."""

    def __init__(self, base_url: str, body: dict) -> None:
        self.events: list[dict | str] = []
        self.first = threading.Event()
        self.error: BaseException | None = None
        payload = {**body, "temperature": 0.0, "ignore_eos": True, "stream": True}
        self._thread = threading.Thread(target=self._read, args=(base_url, payload),
                                        daemon=True)
        self._thread.start()

    def _read(self, base_url: str, payload: dict) -> None:
        try:
            with httpx.stream("POST", f"{base_url}/v1/completions", json=payload,
                              timeout=120) as response:
                assert response.status_code == 200, response.read()
                for line in response.iter_lines():
                    if line.startswith("data: "):
                        data = line.removeprefix("data: ")
                        self.events.append(data if data == "[DONE]" else json.loads(data))
                        self.first.set()
        except BaseException as error:  # reported by the test
            self.error = error
            self.first.set()

    def join(self) -> None:
        self._thread.join(120)
        assert not self._thread.is_alive()


@pytest.fixture()
def serve(long_context_dir: Path) -> Iterator[callable]:
    processes: list[subprocess.Popen] = []

    def start(shutdown_timeout: float) -> tuple[subprocess.Popen, str]:
        port = free_port()
        process = subprocess.Popen(
            [*CLI, "serve", "--model", str(long_context_dir), "--port", str(port),
             "--dtype", "float32", "--block-size", "16", "--num-blocks", "8400",
             "--max-model-len", str(CONTEXT), "--log-level", "info",
             "--shutdown-timeout", str(shutdown_timeout)],
            env=subprocess_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        processes.append(process)
        base = f"http://127.0.0.1:{port}"
        wait_until_healthy(process, base, 90)
        return process, base

    yield start
    for process in processes:
        if process.poll() is None:
            process.kill()
            process.communicate()


def _refuses_connections(base_url: str, deadline_s: float = 10.0) -> bool:
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        try:
            httpx.get(f"{base_url}/health", timeout=2)
        except httpx.ConnectError:
            return True
        except httpx.TransportError:
            pass
        time.sleep(0.05)
    return False


def test_sigterm_drains_then_aborts_and_exits_0(serve) -> None:
    process, base = serve(SHUTDOWN_TIMEOUT_S)
    long, short = Stream(base, LONG), Stream(base, SHORT)
    assert long.first.wait(60) and short.first.wait(60)
    signalled = time.monotonic()
    process.send_signal(signal.SIGTERM)
    short_events_at_signal = len(short.events)
    assert _refuses_connections(base), "new connections were still accepted"
    _, stderr = process.communicate(timeout=SHUTDOWN_TIMEOUT_S + 30)
    took = time.monotonic() - signalled
    long.join()
    short.join()
    assert process.returncode == 0, stderr
    assert SHUTDOWN_TIMEOUT_S <= took < SHUTDOWN_TIMEOUT_S + 15, took
    # the short request ran to its end; the long one got a final error event, then [DONE]
    assert short.error is None and short.events[-1] == "[DONE]"
    assert len(short.events) > short_events_at_signal  # it was still streaming
    assert short.events[-2]["choices"][0]["finish_reason"] == "length"
    assert long.error is None and long.events[-1] == "[DONE]"
    assert long.events[-2]["error"]["code"] == "server_shutting_down"
    assert "aborted 1 requests" in stderr
    assert "KV blocks in use: 0" in stderr, stderr


def test_a_second_sigterm_exits_at_once(serve) -> None:
    process, base = serve(600.0)
    long = Stream(base, LONG)
    assert long.first.wait(60)
    process.send_signal(signal.SIGTERM)
    assert _refuses_connections(base)  # the first signal was handled: draining
    signalled = time.monotonic()
    process.send_signal(signal.SIGTERM)
    _, stderr = process.communicate(timeout=30)
    assert time.monotonic() - signalled < 15
    assert process.returncode == 1, stderr
    assert "second shutdown signal" in stderr
    long.join()
