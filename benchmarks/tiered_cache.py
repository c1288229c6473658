"""The host-memory KV tier on SmolLM2: TTFT of a long prefix served from the pool (L1), from
the host tier (L2) and recomputed, and what write-back costs a workload with no hits.

1. TTFT, one engine with a pool of ``--pool-tokens`` and a host tier: each round warms a new
   ``--prefix`` token prefix, asks it again with a new ``--suffix`` token suffix (an L1 hit),
   pushes it out of the pool with a prompt that fills the pool (it is written back to L2),
   asks it again (an L2 hit: promoted and loaded), and sends a prefix never seen (recomputed).
   Medians over ``--rounds``; targets L2 <= 1.2x L1 and L2 <= 0.1x recompute.
2. Write-back cost: ``--unique`` prompts of ``--unique-tokens`` tokens, no two alike, through a
   pool a tenth their size (every block is evicted, so every one is written back), on the same
   engine with the tier and on one without, rounds interleaved: tokens/s with / without
   (target >= 0.98). The tier's copy bandwidth is reported against a plain ``torch`` copy of
   the same bytes.
3. Disk: the same TTFT with the prefix only on disk (pool refilled, no host tier; its pages
   likely still in the OS page cache), after a restart of the engine on the same directory, and
   recomputed; the write-through's cost is timed with the write-back's (a third engine).
4. Shared store: a second replica loads a prefix the first computed from a ``redis-server``
   started here (skipped where none is installed), against recomputing it.
5. Capacity: ``--sessions`` agent sessions (a ``--history`` token start, ``--turn-tokens`` more
   each turn) visited in turn for ``--turns`` turns, through a pool a quarter of their size,
   alone and with the tier, and through a pool that holds them all: hit rate and mean TTFT.

    python benchmarks/tiered_cache.py [--rounds 5] [--out results/tiered_cache.json]
"""

from __future__ import annotations

import argparse
import functools
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).parent))
from bench_report import write_json

from prefixcache.engine import LLM, SamplingParams

FIRST_TOKEN = SamplingParams(max_tokens=1, temperature=0.0)


def random_tokens(rng: np.random.Generator, count: int) -> list[int]:
    return rng.integers(100, 40000, size=count).tolist()


def ttft(llm: LLM, tokens: list[int]) -> float:
    start = time.perf_counter()
    llm.generate([tokens], FIRST_TOKEN)
    return time.perf_counter() - start


def ttft_by_tier(args: argparse.Namespace) -> dict[str, Any]:
    block = 16
    llm = LLM(num_blocks=args.pool_tokens // block, block_size=block,
              kv_host_memory=args.host_memory)  # fmt: skip
    rng = np.random.default_rng(0)
    ttft(llm, random_tokens(rng, 64))  # warm-up
    times: dict[str, list[float]] = {"L1": [], "L2": [], "recompute": []}
    loads_before = llm.stats()["host_tier_hit_tokens"]
    for _ in range(args.rounds):
        prefix = random_tokens(rng, args.prefix)
        ttft(llm, prefix)  # warm
        times["L1"].append(ttft(llm, prefix + random_tokens(rng, args.suffix)))
        ttft(llm, random_tokens(rng, args.pool_tokens - block))  # fills the pool: all out
        hits = llm.stats()["host_tier_hit_tokens"]
        times["L2"].append(ttft(llm, prefix + random_tokens(rng, args.suffix)))
        promoted = llm.stats()["host_tier_hit_tokens"] - hits
        if promoted < args.prefix - block:
            raise RuntimeError(f"the L2 request loaded {promoted} tokens, not the prefix")
        times["recompute"].append(ttft(llm, random_tokens(rng, args.prefix + args.suffix)))
    medians = {name: statistics.median(values) for name, values in times.items()}
    stats = llm.stats()
    llm.cache.check_invariants()
    return {
        "seconds": times, "medians": medians,
        "l2_over_l1": medians["L2"] / medians["L1"],
        "l2_over_recompute": medians["L2"] / medians["recompute"],
        "l1_over_recompute": medians["L1"] / medians["recompute"],
        "tier_hit_tokens": stats["host_tier_hit_tokens"] - loads_before,
        "host_tier_bytes": stats["host_tier_bytes"],
    }


def disk_tier(args: argparse.Namespace, folder: Path) -> dict[str, Any]:
    """TTFT from the disk tier (the pool refilled, no host tier; the file pages likely still in
    the OS page cache: this machine cannot drop it), after a restart, and recomputed."""
    block = 16
    make = functools.partial(LLM, num_blocks=args.pool_tokens // block, block_size=block,
                             kv_disk_dir=folder)  # fmt: skip
    llm = make()
    rng = np.random.default_rng(3)
    ttft(llm, random_tokens(rng, 64))
    times: dict[str, list[float]] = {"L3": [], "recompute": [], "L3 after restart": []}
    prefixes = []
    for _ in range(args.rounds):
        prefix = random_tokens(rng, args.prefix)
        prefixes.append(prefix)
        ttft(llm, prefix)
        llm.flush_tiers()
        ttft(llm, random_tokens(rng, args.pool_tokens - block))  # the pool forgets it
        llm.flush_tiers()
        hits = llm.stats()["disk_tier_hit_tokens"]
        times["L3"].append(ttft(llm, prefix + random_tokens(rng, args.suffix)))
        if llm.stats()["disk_tier_hit_tokens"] - hits < args.prefix - block:
            raise RuntimeError("the L3 request did not load the prefix from disk")
        times["recompute"].append(ttft(llm, random_tokens(rng, args.prefix + args.suffix)))
    llm.flush_tiers()
    records = llm.stats()["disk_tier_records"]
    del llm
    start = time.perf_counter()
    restarted = make()
    reopen_s = time.perf_counter() - start
    ttft(restarted, random_tokens(rng, 64))
    for prefix in prefixes:
        times["L3 after restart"].append(ttft(restarted, prefix + random_tokens(rng, args.suffix)))
    restarted.flush_tiers()
    restarted.disk_tier.close()
    medians = {name: statistics.median(values) for name, values in times.items()}
    return {
        "seconds": times, "medians": medians, "records": records,
        "engine_start_with_index_s": reopen_s,
        "l3_over_recompute": medians["L3"] / medians["recompute"],
        "restart_over_recompute": medians["L3 after restart"] / medians["recompute"],
    }


def remote_tier(args: argparse.Namespace) -> dict[str, Any] | None:
    """TTFT of a prefix another replica computed, loaded from a ``redis-server`` started here
    (None when none is installed), against recomputing it."""
    if shutil.which("redis-server") is None:
        return None
    import redis

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    folder = tempfile.TemporaryDirectory(prefix="redis-")
    server = subprocess.Popen(["redis-server", "--port", str(port), "--save", "", "--appendonly",
                               "no", "--dir", folder.name], stdout=subprocess.DEVNULL)  # fmt: skip
    url = f"redis://127.0.0.1:{port}/0"
    try:
        for _ in range(200):
            try:
                redis.Redis.from_url(url).ping()
                break
            except redis.ConnectionError:
                time.sleep(0.05)
        block = 16
        make = functools.partial(LLM, num_blocks=args.pool_tokens // block, block_size=block,
                                 kv_remote=url)  # fmt: skip
        first, second = make(), make()
        rng = np.random.default_rng(4)
        for llm in (first, second):
            ttft(llm, random_tokens(rng, 64))
        times: dict[str, list[float]] = {"L4": [], "recompute": []}
        for _ in range(args.rounds):
            prefix = random_tokens(rng, args.prefix)
            ttft(first, prefix)
            first.flush_tiers()
            times["L4"].append(ttft(second, prefix + random_tokens(rng, args.suffix)))
            times["recompute"].append(ttft(second, random_tokens(rng, args.prefix + args.suffix)))
        for llm in (first, second):
            llm.flush_tiers()  # before the store stops
        hits = second.stats()["remote_tier_hit_tokens"]
        if hits < args.rounds * (args.prefix - block):
            raise RuntimeError(f"the second replica loaded {hits} tokens from the store")
        medians = {name: statistics.median(values) for name, values in times.items()}
        return {"seconds": times, "medians": medians,
                "l4_over_recompute": medians["L4"] / medians["recompute"]}  # fmt: skip
    finally:
        server.kill()
        server.wait()
        folder.cleanup()


def write_cost(args: argparse.Namespace, tier: str) -> dict[str, Any]:
    """Tokens/s of unique prompts with ``tier`` ("host": every evicted block written back;
    "disk": every computed block written through, the writes waited for in each round) against
    the same engine without it, rounds alternating."""
    block = 16
    pool = max(args.unique_tokens // block * 2, args.unique * args.unique_tokens // block // 10)
    disk = tempfile.TemporaryDirectory(prefix="kv-disk-")
    option = {"host": {"kv_host_memory": args.host_memory}, "disk": {"kv_disk_dir": disk.name}}
    engines = {
        "with": LLM(num_blocks=pool, block_size=block, **option[tier]),
        "without": LLM(num_blocks=pool, block_size=block),
    }
    rng = np.random.default_rng(1)
    rates: dict[str, list[float]] = {name: [] for name in engines}
    for llm in engines.values():
        llm.generate([random_tokens(rng, 64)], FIRST_TOKEN)  # warm-up
    for round_index in range(args.rounds):
        order = list(engines) if round_index % 2 == 0 else list(engines)[::-1]
        for name in order:
            prompts = [random_tokens(rng, args.unique_tokens) for _ in range(args.unique)]
            start = time.perf_counter()
            for prompt in prompts:
                engines[name].generate([prompt], FIRST_TOKEN)
            engines[name].flush_tiers()  # the writes count, and never spill into the next
            rates[name].append(args.unique * args.unique_tokens / (time.perf_counter() - start))
    tiered = engines["with"]
    stats = tiered.stats()
    tiered.cache.check_invariants()
    pairs = [t / n for t, n in zip(rates["with"], rates["without"], strict=True)]
    result = {
        "tokens_per_s": rates, "median_pair_ratio": statistics.median(pairs),
        "ratio_of_medians": statistics.median(rates["with"]) / statistics.median(rates["without"]),
        "pool_blocks": pool,
    }
    if tier == "host":
        assert stats["host_tier_writebacks"] > 0, "nothing was written back"
        result.update(writebacks=stats["host_tier_writebacks"], copy_gbps=copy_bandwidth(tiered))
    else:
        assert stats["disk_tier_written"] > 0, "nothing was written"
        result.update(records=stats["disk_tier_written"],
                      dropped_writes=stats["disk_tier_dropped_writes"])  # fmt: skip
        tiered.disk_tier.close()
    disk.cleanup()
    return result


def capacity(args: argparse.Namespace) -> dict[str, Any]:
    """Agent sessions visited in turn, more than the pool holds: hit rate and mean TTFT with
    the pool alone, the pool + the host tier, and a pool big enough for everything."""
    block = 16
    total = args.sessions * (args.history + args.turns * args.turn_tokens)
    pools = {"pool only": total // block // 4, "pool + host tier": total // block // 4,
             "unbounded pool": total // block + 64}  # fmt: skip
    results = {}
    for name, blocks in pools.items():
        tier = args.host_memory if name == "pool + host tier" else None
        llm = LLM(num_blocks=blocks, block_size=block, kv_host_memory=tier)
        rng = np.random.default_rng(2)
        histories = [random_tokens(rng, args.history) for _ in range(args.sessions)]
        llm.generate([random_tokens(rng, 32)], FIRST_TOKEN)  # warm-up
        before = llm.stats()
        times = []
        for _ in range(args.turns):
            for history in histories:
                history += random_tokens(rng, args.turn_tokens)
                times.append(ttft(llm, history))
        stats = llm.stats()
        hit = stats["hit_tokens"] - before["hit_tokens"]
        query = stats["query_tokens"] - before["query_tokens"]
        results[name] = {"hit_rate": hit / query, "mean_ttft_s": statistics.mean(times),
                         "pool_blocks": blocks,
                         "tier_hit_tokens": stats.get("host_tier_hit_tokens", 0)}  # fmt: skip
        llm.cache.check_invariants()
    return results


def copy_bandwidth(llm: LLM) -> dict[str, float]:
    """GB/s of the tier's write-back of 64 blocks (every layer) against torch copying the
    same bytes between two contiguous buffers."""
    tier = llm.host_tier
    assert tier is not None
    from prefixcache.host_tier import TierCopy

    count = min(64, tier.num_slots, llm.cache.num_blocks)
    copies = [TierCopy(block, block) for block in range(count)]
    nbytes = 2 * sum(t[0].numel() * t.element_size() for t in llm.kv.k) * len(copies)
    source = torch.empty(nbytes, dtype=torch.uint8)
    target = torch.empty_like(source)

    def best(fn) -> float:
        fn()
        fastest = float("inf")
        for _ in range(5):
            start = time.perf_counter()
            fn()
            fastest = min(fastest, time.perf_counter() - start)
        return nbytes / fastest / 1e9

    return {"tier_writeback": best(lambda: tier.apply(copies, [])),
            "tier_load": best(lambda: tier.apply([], copies)),
            "torch_copy": best(lambda: target.copy_(source))}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--prefix", type=int, default=4096)
    parser.add_argument("--suffix", type=int, default=64)
    parser.add_argument("--pool-tokens", type=int, default=4608)
    parser.add_argument("--host-memory", default="1GiB")
    parser.add_argument("--unique", type=int, default=16)
    parser.add_argument("--unique-tokens", type=int, default=512)
    parser.add_argument("--sessions", type=int, default=12)
    parser.add_argument("--history", type=int, default=768)
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--turn-tokens", type=int, default=48)
    parser.add_argument("--out", default="results/tiered_cache.json")
    args = parser.parse_args()
    by_tier = ttft_by_tier(args)
    m = by_tier["medians"]
    print(f"TTFT, {args.prefix}-token prefix + {args.suffix}: L1 {m['L1']:.3f} s, L2 "
          f"{m['L2']:.3f} s, recompute {m['recompute']:.3f} s; L2 / L1 "
          f"{by_tier['l2_over_l1']:.2f} (target <= 1.2), L2 / recompute "
          f"{by_tier['l2_over_recompute']:.3f} (target <= 0.1)", flush=True)  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="kv-disk-") as folder:
        disk = disk_tier(args, Path(folder))
    d = disk["medians"]
    print(f"TTFT from disk: L3 {d['L3']:.3f} s, after a restart {d['L3 after restart']:.3f} s "
          f"(the engine's start with {disk['records']} records: "
          f"{disk['engine_start_with_index_s']:.1f} s, model load included), recompute "
          f"{d['recompute']:.3f} s; L3 / recompute {disk['l3_over_recompute']:.3f} "
          f"(target <= 0.1)", flush=True)  # fmt: skip
    remote = remote_tier(args)
    if remote is not None:
        r = remote["medians"]
        print(f"TTFT from Redis (another replica computed it): L4 {r['L4']:.3f} s, recompute "
              f"{r['recompute']:.3f} s; L4 / recompute {remote['l4_over_recompute']:.3f} "
              f"(target <= 0.1)", flush=True)  # fmt: skip
    host = write_cost(args, "host")
    bw = host["copy_gbps"]
    print(f"0% hits, every evicted block written back to the host tier: tokens/s with / without "
          f"{host['median_pair_ratio']:.3f} by pairs, {host['ratio_of_medians']:.3f} by medians "
          f"(target >= 0.98); {host['writebacks']} write-backs")  # fmt: skip
    print(f"copy GB/s: write-back {bw['tier_writeback']:.1f}, load {bw['tier_load']:.1f}, "
          f"torch copy of the same bytes {bw['torch_copy']:.1f}")
    on_disk = write_cost(args, "disk")
    print(f"0% hits, every computed block written through to disk: tokens/s with / without "
          f"{on_disk['median_pair_ratio']:.3f} by pairs, {on_disk['ratio_of_medians']:.3f} by "
          f"medians; {on_disk['records']} records")  # fmt: skip
    sessions = capacity(args)
    for name, row in sessions.items():
        print(f"{args.sessions} sessions x {args.turns} turns, {name} ({row['pool_blocks']} "
              f"blocks): hit rate {row['hit_rate']:.1%}, mean TTFT {row['mean_ttft_s']:.3f} s")
    write_json(args.out, {"args": vars(args), "ttft": by_tier, "disk": disk, "remote": remote,
                          "write_back": host,
                          "write_through": on_disk,
                          "capacity": sessions, "torch": torch.__version__})  # fmt: skip


if __name__ == "__main__":
    main()
