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
3. Disk: the same TTFT with the prefix only on disk (pool refilled, no host tier), read with
   O_DIRECT where the file system allows it (so never from the page cache), after a restart of
   the engine on the same directory, and recomputed; the tier's read rate against the same
   files read raw (8 threads, O_DIRECT) and a memory copy; the write-through's cost is timed
   with the write-back's (a third engine).
4. Shared store: a second replica loads a prefix the first computed from a ``redis-server``
   started here (skipped where none is installed), against recomputing it; its read rate
   against a raw MGET of the same values.
5. Capacity: ``--sessions`` agent sessions (a ``--history`` token start, ``--turn-tokens`` more
   each turn) visited in turn for ``--turns`` turns, through a pool a quarter of their size:
   alone, with a host tier, with a host tier of a quarter of their size plus the disk tier,
   and through a pool that holds them all: hit rate and mean TTFT.
6. Quantized tiers (``tier_quant.py``): tokens per GiB, TTFT and greedy agreement with the
   uncached engine for ``kv_tier_dtype`` auto / fp8 / int8.

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
from tier_quant import add_arguments as add_quant_arguments
from tier_quant import agreement, print_agreement
from tier_rates import histogram_rate, memory_copy, raw_disk_read, raw_store_read

from prefixcache.engine import LLM, SamplingParams
from prefixcache.kernels.cpu.kernel_choice import cpu_model

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
    """TTFT from the disk tier (the pool refilled, no host tier; read with O_DIRECT where the
    file system allows, so not from the page cache), from the pool right after (L1, the same
    engine), after a restart, and recomputed; the tier's read rate against raw reads."""
    block = 16
    make = functools.partial(LLM, num_blocks=args.pool_tokens // block, block_size=block,
                             kv_disk_dir=folder)  # fmt: skip
    llm = make()
    rng = np.random.default_rng(3)
    ttft(llm, random_tokens(rng, 64))
    times: dict[str, list[float]] = {"L1": [], "L3": [], "recompute": [], "L3 after restart": []}
    prefixes = []
    before = llm.stats()["tier_latency_seconds"]["disk"]["load"]
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
        times["L1"].append(ttft(llm, prefix + random_tokens(rng, args.suffix)))
        times["recompute"].append(ttft(llm, random_tokens(rng, args.prefix + args.suffix)))
    llm.flush_tiers()
    stats = llm.stats()
    record_bytes = llm.disk_tier.store.record_bytes
    tier_gbps = histogram_rate(before, stats["tier_latency_seconds"]["disk"]["load"],
                               record_bytes)  # fmt: skip
    records = stats["disk_tier_records"]
    direct = llm.disk_tier.store.files.direct
    paths = sorted(llm.disk_tier.store.folder.glob("*.kvb"))[: args.prefix // block]
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
    raw = raw_disk_read(paths)
    return {
        "seconds": times, "medians": medians, "records": records, "direct_io": direct,
        "engine_start_with_index_s": reopen_s,
        "l3_over_l1": medians["L3"] / medians["L1"],
        "l3_over_recompute": medians["L3"] / medians["recompute"],
        "restart_over_recompute": medians["L3 after restart"] / medians["recompute"],
        "tier_read_gbps": tier_gbps, "raw_read": raw,
        "memory_copy_gbps": memory_copy(raw["bytes"]),
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
        times: dict[str, list[float]] = {"L1": [], "L4": [], "recompute": []}
        before = second.stats()["tier_latency_seconds"]["remote"]["load"]
        for _ in range(args.rounds):
            prefix = random_tokens(rng, args.prefix)
            ttft(first, prefix)
            first.flush_tiers()
            times["L4"].append(ttft(second, prefix + random_tokens(rng, args.suffix)))
            times["L1"].append(ttft(second, prefix + random_tokens(rng, args.suffix)))
            times["recompute"].append(ttft(second, random_tokens(rng, args.prefix + args.suffix)))
        for llm in (first, second):
            llm.flush_tiers()  # before the store stops
        stats = second.stats()
        hits = stats["remote_tier_hit_tokens"]
        if hits < args.rounds * (args.prefix - block):
            raise RuntimeError(f"the second replica loaded {hits} tokens from the store")
        record_bytes = second.remote_tier.blocks.record_bytes
        tier_gbps = histogram_rate(before, stats["tier_latency_seconds"]["remote"]["load"],
                                   record_bytes)  # fmt: skip
        client = redis.Redis.from_url(url)
        keys = [key for key in client.scan_iter("pckv:*:p", count=1000)][: args.prefix // block]
        medians = {name: statistics.median(values) for name, values in times.items()}
        return {"seconds": times, "medians": medians,
                "l4_over_l1": medians["L4"] / medians["L1"],
                "l4_over_recompute": medians["L4"] / medians["recompute"],
                "tier_read_gbps": tier_gbps,
                "raw_mget_gbps": raw_store_read(client, keys)}  # fmt: skip
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
    the pool alone, with a host tier that holds them all, with one that holds a quarter plus
    the disk tier, and with a pool big enough for everything."""
    block = 16
    total = args.sessions * (args.history + args.turns * args.turn_tokens)
    quarter = total // block // 4
    small_host = quarter * 16 * 23_040  # a quarter of the sessions' KV (SmolLM2 bf16 bytes)
    disk = tempfile.TemporaryDirectory(prefix="kv-disk-")
    setups: dict[str, tuple[int, dict[str, Any]]] = {
        "pool only": (quarter, {}),
        "pool + host tier": (quarter, {"kv_host_memory": args.host_memory}),
        "pool + 1/4 host tier": (quarter, {"kv_host_memory": small_host}),
        "pool + 1/4 host tier + disk": (quarter, {"kv_host_memory": small_host,
                                                  "kv_disk_dir": disk.name}),
        "unbounded pool": (total // block + 64, {}),
    }  # fmt: skip
    results = {}
    for name, (blocks, tiers) in setups.items():
        llm = LLM(num_blocks=blocks, block_size=block, **tiers)
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
                         "host_tier_hit_tokens": stats.get("host_tier_hit_tokens", 0),
                         "disk_tier_hit_tokens": stats.get("disk_tier_hit_tokens", 0)}  # fmt: skip
        llm.cache.check_invariants()
        llm.tiers.close()
    disk.cleanup()
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
    add_quant_arguments(parser)
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
    print(f"TTFT from disk ({'O_DIRECT' if disk['direct_io'] else 'page cache'}): L3 "
          f"{d['L3']:.3f} s, L1 right after {d['L1']:.3f} s, L3 / L1 {disk['l3_over_l1']:.2f} "
          f"(target <= 2); after a restart {d['L3 after restart']:.3f} s (the engine's start "
          f"with {disk['records']} records: {disk['engine_start_with_index_s']:.1f} s, model "
          f"load included); recompute {d['recompute']:.3f} s; L3 / recompute "
          f"{disk['l3_over_recompute']:.3f} (target <= 0.1)", flush=True)  # fmt: skip
    raw = disk["raw_read"]
    print(f"disk read GB/s: the tier {disk['tier_read_gbps']:.2f} (read + checks), the same "
          f"files raw {raw['gbps']:.2f} ({raw['threads']} threads"
          f"{', O_DIRECT' if raw['direct_io'] else ''}), memory copy "
          f"{disk['memory_copy_gbps']:.1f}", flush=True)  # fmt: skip
    remote = remote_tier(args)
    if remote is not None:
        r = remote["medians"]
        print(f"TTFT from Redis (another replica computed it): L4 {r['L4']:.3f} s, L1 right "
              f"after {r['L1']:.3f} s, recompute {r['recompute']:.3f} s; L4 / recompute "
              f"{remote['l4_over_recompute']:.3f} (target <= 0.1); store read GB/s: the tier "
              f"{remote['tier_read_gbps']:.2f}, a raw MGET {remote['raw_mget_gbps']:.2f}",
              flush=True)  # fmt: skip
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
              f"blocks): hit rate {row['hit_rate']:.1%}, mean TTFT {row['mean_ttft_s']:.3f} s",
              flush=True)  # fmt: skip
    quantized = agreement(args)
    print_agreement(quantized)
    write_json(args.out, {"args": vars(args), "ttft": by_tier, "disk": disk, "remote": remote,
                          "write_back": host, "write_through": on_disk,
                          "capacity": sessions, "quantized_tiers": quantized,
                          "cpu": cpu_model(), "torch": torch.__version__})  # fmt: skip


if __name__ == "__main__":
    main()
