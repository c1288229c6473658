"""Backends that die and come back, as real `prefixcache serve` processes behind the router:
the dead one is out within a second, no request that had not started is lost or doubled, the
one that returns rejoins with a fresh index."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from tiny_model_factory import make_tiny_model_dir

from prefixcache.integrations.router.app import RouterConfig, build_router_app
from prefixcache.integrations.router.forwarding import ROUTED_TO_HEADER
from prefixcache.integrations.server import BackgroundServer
from prefixcache.integrations.server.server_process import free_port, launch, stop

CHATML = ("{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
          "{{ message['content'] }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")  # fmt: skip


class ServeProcess:
    """`prefixcache serve` on the tiny model, publishing KV events."""

    def __init__(self, model: Path) -> None:
        self.model = model
        self.port, self.events_port = free_port(), free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.process: subprocess.Popen | None = None

    def start(self) -> ServeProcess:
        command = [sys.executable, "-m", "prefixcache.integrations.cli", "serve",
                   "--model", str(self.model), "--port", str(self.port), "--dtype", "float32",
                   "--num-blocks", "256", "--block-size", "4", "--served-model-name", "tiny",
                   "--kv-events", f"tcp://127.0.0.1:{self.events_port}",
                   "--log-level", "warning"]  # fmt: skip
        environment = {**os.environ, "PYTHONUNBUFFERED": "1"}
        self.process = launch(command, self.url, environment, timeout_s=120)
        return self

    def kill(self) -> None:
        assert self.process is not None
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(30)

    def stop(self) -> None:
        if self.process is not None:
            stop(self.process, grace_s=30)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = make_tiny_model_dir(tmp_path_factory.mktemp("faults-model"), "llama")
    (folder / "chat_template.jinja").write_text(CHATML)
    return folder


@pytest.fixture
def backends(model_dir: Path) -> Iterator[list[ServeProcess]]:
    processes = [ServeProcess(model_dir), ServeProcess(model_dir)]
    try:
        for process in processes:
            process.start()
        yield processes
    finally:
        for process in processes:
            process.stop()


def backend_states(router: BackgroundServer) -> list[dict]:
    return httpx.get(f"{router.base_url}/router/stats").json()["backends"]


def until(condition, deadline_s: float, what: str) -> float:
    """Seconds until ``condition()`` held; AssertionError after ``deadline_s``."""
    start = time.monotonic()
    while not condition():
        assert time.monotonic() - start < deadline_s, what
        time.sleep(0.02)
    return time.monotonic() - start


def test_a_dead_backend_is_out_at_once_and_rejoins(backends: list[ServeProcess]) -> None:
    config = RouterConfig([b.url for b in backends], health_interval_s=0.25)
    with BackgroundServer(build_router_app(config), lifespan="on") as router:
        body = {"model": "tiny", "prompt": list(range(30, 90)), "max_tokens": 2}
        first = httpx.post(f"{router.base_url}/v1/completions", json=body, timeout=60)
        assert first.status_code == 200
        home = next(b for b in backends if b.url == first.headers[ROUTED_TO_HEADER])
        other = next(b for b in backends if b is not home)
        until(lambda: backend_states(router)[backends.index(home)]["indexed_blocks"] > 0, 10,
              "the router never indexed the first request")  # fmt: skip
        home.kill()
        # every request after the death is answered, once, by the survivor
        for turn in range(8):
            response = httpx.post(f"{router.base_url}/v1/completions", timeout=60,
                                  json={**body, "prompt": body["prompt"] + [turn]})  # fmt: skip
            assert response.status_code == 200, response.text
            assert response.headers[ROUTED_TO_HEADER] == other.url
        dead = backend_states(router)[backends.index(home)]
        assert not dead["healthy"] and dead["indexed_blocks"] == 0
        home.start()  # the same port, an empty cache
        waited = until(lambda: backend_states(router)[backends.index(home)]["healthy"], 10,
                       "the backend never rejoined")  # fmt: skip
        assert waited < 10
        assert backend_states(router)[backends.index(home)]["index"] == "precise"


def test_death_is_noticed_within_a_second_without_traffic(backends: list[ServeProcess]) -> None:
    config = RouterConfig([b.url for b in backends], health_interval_s=0.25)
    with BackgroundServer(build_router_app(config), lifespan="on") as router:
        assert all(b["healthy"] for b in backend_states(router))
        backends[1].kill()
        until(lambda: not backend_states(router)[1]["healthy"], 1.0,
              "the dead backend was still routed to after a second")  # fmt: skip
        assert httpx.get(f"{router.base_url}/health").json()["healthy_backends"] == 1
        backends[0].kill()
        until(lambda: httpx.get(f"{router.base_url}/health").status_code == 503, 1.0,
              "the router kept reporting a backend")  # fmt: skip
        response = httpx.post(f"{router.base_url}/v1/completions",
                              json={"model": "tiny", "prompt": "x", "max_tokens": 1})  # fmt: skip
        assert response.status_code == 503 and response.json()["error"]["code"] == "no_backend"
