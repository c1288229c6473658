"""Three servers behind the router vs round-robin vs one server with three times the pool, on
the agent workload of ``prefixcache bench``, with real SmolLM2 servers on this machine; then
the same run with one backend killed half-way.

    python benchmarks/router_cluster.py [--sessions 12 --turns 4 --pool 160 --json OUT]

Each server runs one thread (OMP_NUM_THREADS=1) and publishes KV events; the router runs in
this process. Every configuration starts from empty caches (``POST /v1/cache/reset``). Prints
hit rate (usage.prompt_tokens_details.cached_tokens / prompt tokens) and TTFT (first streamed
chunk) per configuration and writes JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np
from bench_report import write_json

from prefixcache.integrations.bench.token_source import TokenRange
from prefixcache.integrations.bench.workload_agent import AgentConfig, build_agent
from prefixcache.integrations.router.app import RouterConfig, build_router_app
from prefixcache.integrations.router.forwarding import ROUTED_TO_HEADER
from prefixcache.integrations.router.prompt_tokenizer import PromptTokenizer
from prefixcache.integrations.server import BackgroundServer
from prefixcache.integrations.server.server_process import free_port, launch, stop
from prefixcache.kernels.cpu.kernel_choice import cpu_model

SMOLLM2_VOCAB = 49152


class Server:
    def __init__(self, num_blocks: int) -> None:
        self.num_blocks = num_blocks
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.process: subprocess.Popen | None = None

    def start(self) -> Server:
        command = [sys.executable, "-m", "prefixcache.integrations.cli", "serve",
                   "--port", str(self.port), "--num-blocks", str(self.num_blocks),
                   "--kv-events", f"tcp://127.0.0.1:{free_port()}", "--log-level", "warning"]
        env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
        self.process = launch(command, self.url, env)
        return self

    def kill(self) -> None:
        assert self.process is not None
        self.process.send_signal(signal.SIGKILL)
        self.process.wait()

    def stop(self) -> None:
        if self.process is not None:
            stop(self.process)


async def run_workload(base_url: str, requests: list, concurrency: int,
                       on_done: Any = None) -> dict[str, Any]:  # fmt: skip
    """Send ``requests`` (in order, ``concurrency`` sessions at a time, each session's turns in
    order); TTFT, hit tokens, failures before and after the first byte."""
    by_session: dict[str, list] = {}
    for request in requests:
        by_session.setdefault(request.group, []).append(request)
    results: list[dict[str, Any]] = []
    semaphore = asyncio.Semaphore(concurrency)
    async with httpx.AsyncClient(base_url=base_url, timeout=600) as client:

        async def one(request) -> None:
            body = {"model": "smollm2", "prompt": list(request.prompt_token_ids),
                    "max_tokens": request.max_tokens, "temperature": 0, "stream": True,
                    "stream_options": {"include_usage": True}}  # fmt: skip
            start = time.perf_counter()
            row: dict[str, Any] = {"prompt_tokens": len(request.prompt_token_ids),
                                   "started": False, "ok": False}  # fmt: skip
            try:
                async with client.stream("POST", "/v1/completions", json=body) as response:
                    row["backend"] = response.headers.get(ROUTED_TO_HEADER)
                    async for line in response.aiter_lines():
                        if not line.startswith("data: "):
                            continue
                        if not row["started"]:
                            row["ttft_s"] = time.perf_counter() - start
                            row["started"] = True
                        if line.startswith('data: {') and '"usage":{' in line.replace(" ", ""):
                            usage = httpx.Response(200, content=line[6:]).json()["usage"]
                            details = usage.get("prompt_tokens_details") or {}
                            row["cached_tokens"] = details.get("cached_tokens", 0)
                    row["ok"] = response.status_code == 200 and "cached_tokens" in row
            except httpx.HTTPError as error:
                row["error"] = repr(error)
            results.append(row)
            if on_done is not None:
                on_done(len(results))

        async def session(turns: list) -> None:
            async with semaphore:
                for request in turns:
                    await one(request)

        started = time.perf_counter()
        await asyncio.gather(*(session(turns) for turns in by_session.values()))
        wall = time.perf_counter() - started
    ok = [r for r in results if r["ok"]]
    prompt = sum(r["prompt_tokens"] for r in ok)
    return {
        "requests": len(results), "ok": len(ok), "wall_s": wall,
        "failed_before_first_byte": sum(not r["ok"] and not r["started"] for r in results),
        "failed_while_streaming": sum(not r["ok"] and r["started"] for r in results),
        "hit_rate": sum(r.get("cached_tokens", 0) for r in ok) / prompt if prompt else 0.0,
        "ttft_mean_s": float(np.mean([r["ttft_s"] for r in ok])) if ok else None,
        "ttft_p50_s": float(np.median([r["ttft_s"] for r in ok])) if ok else None,
        "backends_used": len({r.get("backend") for r in ok}),
    }


def reset(urls: list[str]) -> None:
    for url in urls:
        httpx.post(f"{url}/v1/cache/reset", json={}, timeout=60).raise_for_status()


def routed(servers: list[Server], policy: str, requests: list, concurrency: int,
           kill_after: int | None = None) -> dict[str, Any]:  # fmt: skip
    reset([s.url for s in servers if s.process and s.process.poll() is None])
    config = RouterConfig([s.url for s in servers], policy=policy,
                          tokenizer=PromptTokenizer.load("smollm2"))  # fmt: skip

    def maybe_kill(done: int) -> None:
        if kill_after is not None and done == kill_after:
            servers[0].kill()

    with BackgroundServer(build_router_app(config), lifespan="on") as router:
        return asyncio.run(run_workload(router.base_url, requests, concurrency, maybe_kill))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=12)
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--pool", type=int, default=160, help="blocks per routed server")
    parser.add_argument("--concurrency", type=int, default=3)
    parser.add_argument("--json", type=Path, default=Path("results/router_cluster.json"))
    args = parser.parse_args()
    requests = build_agent(AgentConfig(num_sessions=args.sessions, turns_per_session=args.turns),
                           seed=0, tokens=TokenRange.for_vocab(SMOLLM2_VOCAB))  # fmt: skip
    report: dict[str, Any] = {"cpu": cpu_model(),
                              "sessions": args.sessions, "turns": args.turns,
                              "pool_blocks": args.pool, "concurrency": args.concurrency}
    big = Server(3 * args.pool).start()
    try:
        reset([big.url])
        report["one_server_3x_pool"] = asyncio.run(run_workload(big.url, requests,
                                                                args.concurrency))  # fmt: skip
    finally:
        big.stop()
    servers = [Server(args.pool).start() for _ in range(3)]
    try:
        report["cache_aware"] = routed(servers, "cache_aware", requests, args.concurrency)
        report["round_robin"] = routed(servers, "round_robin", requests, args.concurrency)
        half = len(requests) // 2
        report["cache_aware_backend_killed"] = routed(servers, "cache_aware", requests,
                                                      args.concurrency, half)
    finally:
        for server in servers:
            server.stop()
    aware, rr, one = report["cache_aware"], report["round_robin"], report["one_server_3x_pool"]
    report["hit_rate_vs_one_big_server"] = aware["hit_rate"] / one["hit_rate"]
    report["ttft_mean_round_robin_over_cache_aware"] = rr["ttft_mean_s"] / aware["ttft_mean_s"]
    for name in ("one_server_3x_pool", "cache_aware", "round_robin", "cache_aware_backend_killed"):
        row = report[name]
        print(f"{name:28s} hit {row['hit_rate']:.3f}  TTFT mean {row['ttft_mean_s']:.3f} s  "
              f"p50 {row['ttft_p50_s']:.3f} s  ok {row['ok']}/{row['requests']}  failed before "
              f"first byte {row['failed_before_first_byte']}, while streaming "
              f"{row['failed_while_streaming']}")  # fmt: skip
    print(f"hit rate / one server with 3x pool: {report['hit_rate_vs_one_big_server']:.3f}; "
          f"round-robin / cache-aware mean TTFT: "
          f"{report['ttft_mean_round_robin_over_cache_aware']:.2f}")  # fmt: skip
    write_json(args.json, report)


if __name__ == "__main__":
    main()
