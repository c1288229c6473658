"""A server in a child process, for the benchmarks and tests that need a real one: a free
port, a command started and waited for until its ``/health`` answers, and a clean stop.

    port = free_port()
    process = launch([*cli, "serve", "--port", str(port), ...], f"http://127.0.0.1:{port}",
                     environment)
    ...
    stop(process)
"""

from __future__ import annotations

import signal
import socket
import subprocess
import time

import httpx


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nothing listens on now (the OS's choice for a socket bound to port 0)."""
    with socket.socket() as probe:
        probe.bind((host, 0))
        return probe.getsockname()[1]


def wait_until_healthy(process: subprocess.Popen, url: str, timeout_s: float = 300.0) -> None:
    """Returns once ``url``/health answers 200. RuntimeError, with the end of the process's
    stderr where it is piped, if the process exits first; after ``timeout_s`` the process is
    killed and RuntimeError raised."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            error = process.communicate()[1] if process.stderr is not None else b""
            raise RuntimeError(f"the server exited with {process.returncode}: "
                               f"{(error or b'').decode(errors='replace')[-2000:]}")  # fmt: skip
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    process.kill()
    raise RuntimeError(f"{url} did not answer /health within {timeout_s:.0f} s")


def launch(command: list[str], url: str, environment: dict[str, str],
           timeout_s: float = 300.0) -> subprocess.Popen:  # fmt: skip
    """Start ``command`` (its stdout discarded, its stderr kept for the error) and wait until
    ``url``/health answers (``wait_until_healthy``)."""
    process = subprocess.Popen(command, env=environment, stdout=subprocess.DEVNULL,
                               stderr=subprocess.PIPE)  # fmt: skip
    wait_until_healthy(process, url, timeout_s)
    return process


def stop(process: subprocess.Popen, grace_s: float = 60.0) -> None:
    """SIGINT (a server drains, then exits), then SIGKILL if it is still up after
    ``grace_s``."""
    if process.poll() is None:
        process.send_signal(signal.SIGINT)
        try:
            process.wait(grace_s)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
