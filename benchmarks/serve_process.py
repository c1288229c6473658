"""Server processes for the benchmarks that need real ones: a free port, a command started
and waited for until its ``/health`` answers, and a clean stop."""

from __future__ import annotations

import signal
import socket
import subprocess
import time

import httpx


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def launch(command: list[str], url: str, environment: dict[str, str],
           timeout_s: float = 300.0) -> subprocess.Popen:  # fmt: skip
    """Start ``command``; returns once ``url``/health answers 200. RuntimeError with the
    process's last output if it exits first, or after ``timeout_s``."""
    process = subprocess.Popen(command, env=environment, stdout=subprocess.DEVNULL,
                               stderr=subprocess.PIPE)  # fmt: skip
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(process.communicate()[1].decode()[-2000:])
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return process
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    process.kill()
    raise RuntimeError(f"{' '.join(command[:5])} did not start")


def stop(process: subprocess.Popen) -> None:
    """SIGINT (the server drains), then kill if it has not exited within a minute."""
    if process.poll() is None:
        process.send_signal(signal.SIGINT)
        try:
            process.wait(60)
        except subprocess.TimeoutExpired:
            process.kill()
