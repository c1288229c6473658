"""Soak test: does the server's memory stay flat over many mixed requests?

Starts ``prefixcache serve`` as a subprocess (a free port, ``--log-level warning``), waits for
``/health``, then drives it with ``--concurrency`` async clients through a seeded mix
(``soak_workload.py``: completions and chat, streamed or not, streams whose client leaves
after a few chunks, ``n`` > 1, shared long prefixes, long unique prompts, bad inputs). Every
``--sample-every`` requests it reads the server's RSS (``VmRSS`` of its process and any
children) and the cache counters. The RSS reached after ``--warmup`` requests (default: the
first 10%, at least 500 but at most half) is the baseline; the run passes when no later
sample is more than ``--max-growth`` percent above it, no block is left in use once every
request has ended, the cache's invariants hold (``/v1/cache/stats`` checks them) and every
response had an expected status. ``--requests 2000`` is a quick first look.

The server inherits this process's environment, so allocator settings apply to it. glibc
caps its malloc arenas at 8 per core, so growth from memory held per thread shows up less on
a small machine; ``MALLOC_ARENA_MAX=64`` gives a 2-core machine the cap of an 8-core one::

    python benchmarks/soak.py [--requests 10000] [--concurrency 32] [--seed 0]
                              [--server-arg=--num-blocks --server-arg=512]
                              [--out results/soak.json]
    MALLOC_ARENA_MAX=64 python benchmarks/soak.py --requests 4000 --concurrency 64
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import importlib.metadata
import os
import platform
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).parent))
from bench_report import write_json
from soak_workload import Case, Workload

from prefixcache.integrations.server.server_process import free_port

LEFT = "left"  # outcome of a request whose client closed the connection on purpose


# ------------------------------------------------------------------ the server process
def rss_bytes(pid: int) -> int:
    """Resident memory of ``pid`` and its descendants (``VmRSS``), in bytes; 0 once gone."""
    total, pending = 0, [pid]
    while pending:
        current = pending.pop()
        try:
            status = Path(f"/proc/{current}/status").read_text()
        except OSError:
            continue
        for line in status.splitlines():
            if line.startswith("VmRSS:"):
                total += int(line.split()[1]) * 1024
        for task in Path(f"/proc/{current}/task").glob("*/children"):
            with contextlib.suppress(OSError):
                pending += [int(child) for child in task.read_text().split()]
    return total


class ServerProcess:
    """``prefixcache serve`` on a free port in a subprocess; its output goes to a log file."""

    def __init__(self, model: str, extra_args: list[str]) -> None:
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        handle, self.log_path = tempfile.mkstemp(prefix="soak-server-", suffix=".log")
        script = Path(sys.executable).with_name("prefixcache")  # the console script
        launcher = [str(script)] if script.exists() else [
            sys.executable, "-m", "prefixcache.integrations.cli"]
        command = [*launcher, "serve", "--model", model, "--port", str(self.port),
                   "--log-level", "warning", *extra_args]
        self.process = subprocess.Popen(command, stdout=handle, stderr=subprocess.STDOUT)
        os.close(handle)  # the child holds its own copy

    @property
    def pid(self) -> int:
        return self.process.pid

    def log_tail(self, lines: int = 20) -> str:
        return "\n".join(Path(self.log_path).read_text(errors="replace").splitlines()[-lines:])

    def wait_healthy(self, timeout: float) -> float:
        """Seconds until ``/health`` answers; RuntimeError if the server exits or times out."""
        start = time.perf_counter()
        while time.perf_counter() - start < timeout:
            if self.process.poll() is not None:
                raise RuntimeError(f"the server exited ({self.process.returncode}):\n"
                                   f"{self.log_tail()}")
            try:
                if httpx.get(self.base_url + "/health", timeout=2).status_code == 200:
                    return time.perf_counter() - start
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        raise RuntimeError(f"no /health after {timeout:.0f} s:\n{self.log_tail()}")

    def stop(self) -> None:
        """Stop the server (SIGINT, then SIGKILL after 30 s) and remove its log."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        with contextlib.suppress(OSError):
            os.remove(self.log_path)


def vocab_size(base_url: str) -> int:
    """The served model's vocabulary size, bisected with ``/detokenize`` (which refuses ids
    outside the vocabulary)."""
    low, high = 1, 1 << 22  # ``low`` is a valid id count, ``high`` is not
    with httpx.Client(base_url=base_url, timeout=30) as client:
        while high - low > 1:
            middle = (low + high) // 2
            ok = client.post("/detokenize", json={"tokens": [middle - 1]}).status_code == 200
            low, high = (middle, high) if ok else (low, middle)
    return low


# ------------------------------------------------------------------ driving it
@dataclass
class Sample:
    requests: int
    seconds: float
    rss: int
    stats: dict[str, Any] = field(default_factory=dict)


async def run_case(client: httpx.AsyncClient, case: Case) -> str:
    """Send one case; its outcome: the status code, ``left`` if the client left on purpose
    (before the response ended), or the exception's type name."""
    kwargs: dict[str, Any] = {}
    if isinstance(case.body, bytes):
        kwargs = {"content": case.body, "headers": {"content-type": "application/json"}}
    elif case.body is not None:
        kwargs = {"json": case.body}
    try:
        if case.stream:
            async with client.stream(case.method, case.path, **kwargs) as response:
                chunks = 0
                async for line in response.aiter_lines():
                    if line.startswith("data: "):
                        chunks += 1
                        if case.leave_after is not None and chunks >= case.leave_after \
                                and line != "data: [DONE]":
                            return LEFT  # leaving the block closes the connection
                return str(response.status_code)
        request = client.request(case.method, case.path, **kwargs)
        if case.leave_after is None:
            return str((await request).status_code)
        try:
            response = await asyncio.wait_for(request, case.leave_after)
        except TimeoutError:
            return LEFT
        return str(response.status_code)
    except httpx.HTTPError as error:
        return type(error).__name__


@dataclass
class Drive:
    """What a soak saw: outcome counts, client seconds by case kind, RSS samples (one before
    the first request, then one every ``sample_every`` requests done), unexpected outcomes."""

    outcomes: collections.Counter = field(default_factory=collections.Counter)
    busy: collections.Counter = field(default_factory=collections.Counter)
    samples: list[Sample] = field(default_factory=list)
    unexpected: list[str] = field(default_factory=list)


async def drive(base_url: str, pid: int, cases: list[Case], concurrency: int,
                sample_every: int) -> Drive:
    """Run every case, ``concurrency`` clients at a time."""
    seen = Drive()
    outcomes, busy, samples, unexpected = seen.outcomes, seen.busy, seen.samples, seen.unexpected
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    start = time.perf_counter()
    next_case = iter(enumerate(cases))
    done = 0
    async with httpx.AsyncClient(base_url=base_url, timeout=600, limits=limits) as client:

        async def sample() -> None:
            response = await client.get("/v1/cache/stats")
            stats = response.json() if response.status_code == 200 else {}
            samples.append(Sample(done, time.perf_counter() - start, rss_bytes(pid), stats))

        async def worker() -> None:
            nonlocal done
            for index, case in next_case:
                began = time.perf_counter()
                outcome = await run_case(client, case)
                busy[case.kind] += time.perf_counter() - began
                outcomes[outcome] += 1
                if outcome != LEFT and not (outcome.isdigit() and int(outcome) in case.expect):
                    unexpected.append(f"#{index} {case.kind}: {outcome}")
                done += 1
                if done % sample_every == 0 or done == len(cases):
                    await sample()
                    print(f"\r{done}/{len(cases)} requests, RSS "
                          f"{samples[-1].rss / 2**20:,.0f} MiB", end="", flush=True)

        await sample()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
    print()
    return seen


async def settled_stats(base_url: str, timeout: float = 60.0) -> tuple[int, dict[str, Any]]:
    """``/v1/cache/stats`` once no request runs or waits (aborts land a moment after their
    client left): its status code (500 if an invariant broke) and body."""
    async with httpx.AsyncClient(base_url=base_url, timeout=60) as client:
        deadline = time.perf_counter() + timeout
        while True:
            response = await client.get("/v1/cache/stats")
            body = response.json()
            idle = response.status_code == 200 and not body.get("running") \
                and not body.get("waiting") and body.get("in_use") == 0
            if idle or time.perf_counter() > deadline:
                return response.status_code, body
            await asyncio.sleep(0.5)


# ------------------------------------------------------------------ the report
def machine() -> dict[str, str]:
    """CPU model, torch version and git revision of the run."""
    cpu = platform.processor() or platform.machine()
    try:
        for line in subprocess.run(["lscpu"], capture_output=True, text=True).stdout.splitlines():
            if line.startswith("Model name:"):
                cpu = line.split(":", 1)[1].strip()
    except OSError:
        pass
    here = Path(__file__).parent
    git = subprocess.run(["git", "-C", str(here), "rev-parse", "--short", "HEAD"],
                         capture_output=True, text=True)
    dirty = subprocess.run(["git", "-C", str(here), "status", "--porcelain"],
                           capture_output=True, text=True).stdout.strip()
    return {
        "cpu": cpu,
        "cores": str(os.cpu_count()),
        "python": platform.python_version(),
        "torch": importlib.metadata.version("torch"),
        "git": (git.stdout.strip() or "unknown") + ("+dirty" if dirty else ""),
    }


def growth_report(samples: list[Sample], warmup: int, max_growth: float) -> dict[str, Any]:
    """RSS at the first sample at or after ``warmup`` requests, the final and the largest
    after it, growth in percent over the baseline, and a least-squares slope (KiB a request)."""
    after = [s for s in samples if s.requests >= warmup] or samples[-1:]
    base, final = after[0].rss, after[-1].rss
    peak = max(s.rss for s in after)
    xs, ys = [s.requests for s in after], [s.rss for s in after]
    mean_x, mean_y = sum(xs) / len(xs), sum(ys) / len(ys)
    spread = sum((x - mean_x) ** 2 for x in xs)
    slope = sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys, strict=True)) / spread \
        if spread else 0.0
    growth = 100 * (peak - base) / base
    return {
        "warmup_requests": after[0].requests, "rss_fresh": samples[0].rss,
        "rss_warmup": base, "rss_final": final, "rss_max": peak,
        "growth_final_pct": 100 * (final - base) / base, "growth_max_pct": growth,
        "slope_kib_per_request": slope / 1024, "max_growth_pct": max_growth,
        "rss_pass": growth <= max_growth,
    }


def print_table(samples: list[Sample], growth: dict[str, Any], outcomes: collections.Counter,
                end_status: int, end_stats: dict[str, Any], unexpected: list[str]) -> None:
    mib = 2**20
    print(f"{'requests':>9} {'seconds':>8} {'RSS MiB':>9} {'in use':>7} {'cached':>7} "
          f"{'nodes':>6}")
    step = max(1, len(samples) // 12)
    for s in [*samples[:-1:step], samples[-1]]:
        print(f"{s.requests:>9} {s.seconds:>8.0f} {s.rss / mib:>9,.0f} "
              f"{s.stats.get('in_use', '-'):>7} {s.stats.get('cached', '-'):>7} "
              f"{s.stats.get('nodes', '-'):>6}")
    print(f"RSS fresh {growth['rss_fresh'] / mib:,.0f} MiB; after warm-up "
          f"({growth['warmup_requests']} requests) {growth['rss_warmup'] / mib:,.0f} MiB, final "
          f"{growth['rss_final'] / mib:,.0f} MiB, max {growth['rss_max'] / mib:,.0f} MiB: growth "
          f"{growth['growth_final_pct']:+.1f}% final, {growth['growth_max_pct']:+.1f}% max "
          f"({growth['slope_kib_per_request']:+.1f} KiB a request) -> "
          f"{'PASS' if growth['rss_pass'] else 'FAIL'} (limit {growth['max_growth_pct']}%)")
    print("outcomes: " + ", ".join(f"{k} x{v}" for k, v in sorted(outcomes.items())))
    print(f"end: /v1/cache/stats {end_status}, in use {end_stats.get('in_use')} blocks, "
          f"running {end_stats.get('running')}, waiting {end_stats.get('waiting')}")
    for line in unexpected[:10]:
        print(f"unexpected: {line}")
    if len(unexpected) > 10:
        print(f"unexpected: ... {len(unexpected) - 10} more")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=10_000)
    parser.add_argument("--warmup", type=int, default=None,
                        help="requests before the baseline (default: 10%%, at least 500, at most "
                        "half)")
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--sample-every", type=int, default=100, help="requests between RSS "
                        "samples")
    parser.add_argument("--max-growth", type=float, default=10.0, help="percent over the "
                        "warm-up RSS")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--server-arg", action="append", default=[],
                        help="passed to `prefixcache serve` (repeatable; --server-arg=--flag)")
    parser.add_argument("--startup-timeout", type=float, default=600.0)
    parser.add_argument("--out", type=Path, default=Path("results/soak.json"))
    args = parser.parse_args()
    warmup = args.warmup if args.warmup is not None else min(
        max(500, args.requests // 10), args.requests // 2)  # a short run keeps half to measure
    if args.requests < 1 or not 0 <= warmup < args.requests:
        parser.error("need --requests >= 1 and 0 <= --warmup < --requests")

    server = ServerProcess(args.model, args.server_arg)
    try:
        startup = server.wait_healthy(args.startup_timeout)
        info = httpx.get(server.base_url + "/v1/models", timeout=30).json()["data"][0]
        vocab = vocab_size(server.base_url)
        workload = Workload(args.seed, info["id"], info["max_model_len"], vocab)
        cases = workload.cases(args.requests)
        print(f"server up in {startup:.0f} s (pid {server.pid}); {args.requests} requests, "
              f"concurrency {args.concurrency}, warm-up {warmup}")
        start = time.perf_counter()
        seen = asyncio.run(
            drive(server.base_url, server.pid, cases, args.concurrency, args.sample_every))
        outcomes, samples, unexpected = seen.outcomes, seen.samples, seen.unexpected
        seconds = time.perf_counter() - start
        end_status, end_stats = asyncio.run(settled_stats(server.base_url))
        samples.append(Sample(args.requests, time.perf_counter() - start,
                              rss_bytes(server.pid), end_stats))
        if server.process.poll() is not None:
            raise RuntimeError(f"the server died during the soak:\n{server.log_tail()}")
    finally:
        server.stop()

    growth = growth_report(samples, warmup, args.max_growth)
    print_table(samples, growth, outcomes, end_status, end_stats, unexpected)
    no_leak = end_status == 200 and end_stats.get("in_use") == 0
    passed = growth["rss_pass"] and no_leak and not unexpected
    print(f"{'PASS' if passed else 'FAIL'} ({args.requests} requests in {seconds:.0f} s)")
    report = {
        "machine": machine(),
        "config": {**{k: v for k, v in vars(args).items() if k != "out"}, "warmup": warmup,
                   "server_env": {k: v for k, v in os.environ.items()
                                  if k.startswith(("MALLOC_", "OMP_", "PREFIXCACHE_"))
                                  and k != "PREFIXCACHE_API_KEY"},
                   "mix": dict(collections.Counter(case.kind for case in cases))},
        "seconds": seconds,
        "growth": growth,
        "outcomes": dict(outcomes),
        "client_seconds_by_kind": {k: round(v, 1) for k, v in seen.busy.most_common()},
        "unexpected": unexpected,
        "end": {"status": end_status, "stats": end_stats, "blocks_leaked": not no_leak},
        "samples": [{"requests": s.requests, "seconds": round(s.seconds, 2), "rss": s.rss,
                     **{k: s.stats.get(k) for k in ("in_use", "cached", "free", "nodes",
                                                    "running", "waiting")}}
                    for s in samples],
        "passed": passed,
    }
    write_json(args.out, report)
    if not passed:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
