"""`prefixcache serve --kv-disk-dir`: killed with SIGKILL while it computes and writes, then
started again on the same directory, it serves no torn or corrupt record, says how many it
dropped, answers as before, and the prefixes that reached the disk are hits."""

from __future__ import annotations

import contextlib
import signal
import subprocess
import threading
import time
from pathlib import Path

import httpx
from integration_helpers import CLI, SERVED_NAME, counter_value, subprocess_env

from prefixcache.integrations.server.server_process import free_port, wait_until_healthy

PROMPTS = [" ".join(f"d{k}w{i % 13}" for i in range(24)) for k in range(6)]


def serve(folder: Path, disk: Path, port: int) -> subprocess.Popen:
    command = [*CLI, "serve", "--model", str(folder), "--served-model-name", SERVED_NAME,
               "--port", str(port), "--dtype", "float32", "--block-size", "4",
               "--num-blocks", "256", "--kv-disk-dir", str(disk), "--log-level", "warning"]
    return subprocess.Popen(command, env=subprocess_env(), stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)  # fmt: skip


def complete(base: str, prompt: str) -> str:
    body = {"model": SERVED_NAME, "prompt": prompt, "max_tokens": 8, "temperature": 0}
    response = httpx.post(f"{base}/v1/completions", json=body, timeout=60)
    assert response.status_code == 200, response.text
    return response.json()["choices"][0]["text"]


def test_sigkill_mid_write_then_restart(tiny_chat_dir: Path, tmp_path: Path) -> None:
    disk = tmp_path / "kv"
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    server = serve(tiny_chat_dir, disk, port)
    try:
        wait_until_healthy(server, base, 90)
        first = [complete(base, p) for p in PROMPTS[:3]]
        end = time.monotonic() + 30  # the writer runs in the background: until records land
        while not list(disk.rglob("*.kvb")):
            assert time.monotonic() < end, "no record was written"
            time.sleep(0.05)
        in_flight = [threading.Thread(target=lambda p=p: _quietly(base, p), daemon=True)
                     for p in PROMPTS[3:]]  # fmt: skip
        for thread in in_flight:
            thread.start()
        server.send_signal(signal.SIGKILL)  # computing and writing, mid-request
        server.wait(30)
    finally:
        if server.poll() is None:
            server.kill()
    store = next(p for p in disk.iterdir() if p.is_dir())
    records = sorted(store.glob("*.kvb"))
    assert records
    torn = records[-1]
    torn.write_bytes(torn.read_bytes()[:-64])  # as if the kill landed inside this write
    (store / ".tmp-killed-here").write_bytes(b"PCKV1\n")
    server = serve(tiny_chat_dir, disk, port)
    try:
        wait_until_healthy(server, base, 90)
        again = [complete(base, p) for p in PROMPTS[:3]]
        stats = httpx.get(f"{base}/v1/cache/stats", timeout=10).json()
        metrics = httpx.get(f"{base}/metrics", timeout=10).text
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(30)
    assert again == first
    assert stats["disk_tier_dropped_records"] >= 2  # the torn record and the temporary file
    assert stats["disk_tier_hit_tokens"] > 0
    assert stats["in_use"] == 0
    dropped = counter_value(metrics, "prefixcache_disk_tier_dropped_records_total ")
    assert dropped == stats["disk_tier_dropped_records"]
    assert counter_value(metrics, "prefixcache_disk_tier_hits_tokens_total ") > 0
    disk = stats["tier_latency_seconds"]["disk"]
    assert disk["load"]["count"] >= 1 and disk["load"]["sum"] > 0
    assert disk["load"]["blocks"] * 4 >= stats["disk_tier_hit_tokens"]
    loads = counter_value(metrics, 'prefixcache_kv_tier_load_seconds_count{tier="disk"} ')
    assert loads == disk["load"]["count"]


def _quietly(base: str, prompt: str) -> None:
    with contextlib.suppress(httpx.HTTPError, AssertionError):  # killed under it
        complete(base, prompt)
