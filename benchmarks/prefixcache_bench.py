"""Core micro-benchmarks of `prefixcache.PrefixCache`, with baselines measured in the same run.

1. match of a fully cached 32K-token prompt: vLLM-style pickled SHA-256 / xxh3_128 block-hash
   chains and a plain xxh3_64 chain (dict lookups until a miss) vs `cache.match` (numpy int32
   and list input); `insert` of the same prompt into an empty cache.
2. scale: ~1M cached blocks of shared-prefix traffic; index memory per cached block
   (tracemalloc, token ids included) and the 32K match there vs in a small cache.
3. allocation from a full pool where every allocation evicts: us per block.

Times are medians of repeats (`time.perf_counter_ns`, garbage collector off while timing);
the timings compared in a ratio run interleaved, one of each per round.

    python benchmarks/prefixcache_bench.py [--quick] [--out results/prefixcache_bench.json]
"""

from __future__ import annotations

import argparse
import gc
import sys
import time
import tracemalloc
from pathlib import Path
from typing import Any

import vllm_block_hash as vllm
from bench_report import write_json
from bench_timing import discard, interleaved_median_ms, median_ms, median_ns
from rich.console import Console
from rich.table import Table
from shared_prefix_traffic import BLOCK_SIZE, cached_cache, full_cache, populate, prompt_tokens

from prefixcache import PrefixCache

TARGETS = {  # name: (target, "<=" or ">=")
    "match_numpy_ms": (0.3, "<="),
    "speedup_vs_vllm_sha256": (10.0, ">="),
    "insert_empty_ms": (1.5, "<="),
    "bytes_per_cached_block": (160.0, "<="),
    "match_big_over_small": (2.0, "<="),
    "allocate1_us_per_block": (5.0, "<="),
    "allocate16_us_per_block": (5.0, "<="),
}


def match_timers(cache: PrefixCache, tokens: Any, label: str) -> dict[str, Any]:
    """Timers for match alone (refs released untimed), match + release, and lookup."""
    check = cache.match(tokens)
    assert check.num_tokens == (len(tokens) // BLOCK_SIZE) * BLOCK_SIZE, check.num_tokens
    cache.release(check.block_ids)

    def release(hit: Any) -> None:
        cache.release(hit.block_ids)

    return {
        f"match_{label}_ms": (lambda: cache.match(tokens), release),
        f"match_release_{label}_ms": (lambda: release(cache.match(tokens)), discard),
        f"lookup_{label}_ms": (lambda: cache.lookup(tokens), discard),
    }


def bench_match(num_tokens: int, rounds: int, seed: int) -> dict[str, Any]:
    """Baselines and ours on the same fully cached prompt, timed in interleaved rounds;
    then insert into an empty cache."""
    tokens = prompt_tokens(num_tokens, seed)
    token_list = tokens.tolist()
    num_full = num_tokens // BLOCK_SIZE
    timers: dict[str, Any] = {}
    for name, hash_fn in (
        ("vllm_sha256_pickle_ms", vllm.sha256_pickle),
        ("vllm_xxh3_128_pickle_ms", vllm.xxh3_128_pickle),
    ):
        hashes = vllm.pickled_block_hashes(token_list, BLOCK_SIZE, hash_fn)
        table = {h: block for block, h in enumerate(hashes)}
        assert len(vllm.pickled_match(token_list, BLOCK_SIZE, hash_fn, table)) == num_full
        timers[name] = (
            lambda f=hash_fn, t=table: vllm.pickled_match(token_list, BLOCK_SIZE, f, t),
            discard,
        )
    table64 = {h: block for block, h in enumerate(vllm.xxh3_64_chain_hashes(tokens, BLOCK_SIZE))}
    assert len(vllm.xxh3_64_chain_match(tokens, BLOCK_SIZE, table64)) == num_full
    timers["xxh3_64_chain_ms"] = (
        lambda: vllm.xxh3_64_chain_match(tokens, BLOCK_SIZE, table64),
        discard,
    )
    cache = cached_cache(tokens, num_full + 64)
    timers.update(match_timers(cache, tokens, "numpy"))
    timers.update(match_timers(cache, token_list, "list"))
    result: dict[str, Any] = {"num_tokens": num_tokens, **interleaved_median_ms(timers, rounds)}
    cache.check_invariants()

    def fresh_cache_and_ids() -> tuple[PrefixCache, list[int]]:
        fresh = PrefixCache(num_blocks=num_full + 64, block_size=BLOCK_SIZE)
        return fresh, fresh.allocate(num_full)

    def insert(state: tuple[PrefixCache, list[int]]) -> int:
        return state[0].insert(tokens, state[1])

    def check_inserted(count: int) -> None:
        assert count == num_full, count

    result["insert_empty_ms"] = median_ms(
        insert, max(5, rounds // 4), setup=fresh_cache_and_ids, after=check_inserted
    )
    return result


def bench_scale(
    target_blocks: int,
    groups: int,
    prefix_blocks: int,
    suffix_blocks: int,
    num_tokens: int,
    repeats: int,
    seed: int,
) -> dict[str, Any]:
    """Index memory per cached block at ~target_blocks, and the 32K match there vs small."""
    per_group = -(-(target_blocks - groups * prefix_blocks) // (groups * suffix_blocks))
    per_group = max(1, per_group)
    big_prompt = prompt_tokens(num_tokens, seed)
    num_blocks = groups * (prefix_blocks + per_group * suffix_blocks) + num_tokens // BLOCK_SIZE
    gc.collect()
    tracemalloc.start()
    baseline = tracemalloc.get_traced_memory()[0]
    started = time.perf_counter()
    cache = PrefixCache(num_blocks=num_blocks, block_size=BLOCK_SIZE)
    requests = populate(cache, groups, prefix_blocks, per_group, suffix_blocks, seed + 1)
    ids = cache.allocate(num_tokens // BLOCK_SIZE)
    cache.insert(big_prompt, ids)
    cache.release(ids)
    del ids
    populate_s = time.perf_counter() - started
    gc.collect()
    current, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    stats = cache.stats()
    assert stats["cached"] == num_blocks and stats["free"] == 0, stats
    index_bytes = current - baseline
    small_cache = cached_cache(big_prompt, num_tokens // BLOCK_SIZE + 64)
    timers = {
        **match_timers(cache, big_prompt, "big"),
        **match_timers(small_cache, big_prompt, "small"),
    }
    times = interleaved_median_ms(timers, repeats)
    cache.check_invariants()
    return {
        "cached_blocks": stats["cached"],
        "nodes": stats["nodes"],
        "requests": requests,
        "groups": groups,
        "prefix_blocks": prefix_blocks,
        "suffix_blocks": suffix_blocks,
        "populate_s_traced": populate_s,
        "index_bytes": index_bytes,
        "peak_traced_bytes": peak - baseline,
        "bytes_per_cached_block": index_bytes / stats["cached"],
        **times,
        "match_big_over_small": times["match_big_ms"] / times["match_small_ms"],
    }


def bench_evicting_allocate(num_blocks: int, repeats: int, seed: int) -> dict[str, Any]:
    """allocate(1) and allocate(16) of half a full pool (each call evicts); us per block."""
    blocks_to_allocate = num_blocks // 2
    result: dict[str, Any] = {"num_blocks": num_blocks, "blocks_allocated": blocks_to_allocate}
    for n in (1, 16):
        calls = blocks_to_allocate // n

        def allocate_all(cache: PrefixCache, n: int = n, calls: int = calls) -> PrefixCache:
            for _ in range(calls):
                cache.allocate(n)
            return cache

        def check_all_evicted(cache: PrefixCache, n: int = n, calls: int = calls) -> None:
            assert cache.stats()["evictions"] == n * calls

        ns = median_ns(
            allocate_all,
            repeats,
            setup=lambda: full_cache(num_blocks, seed),
            after=check_all_evicted,
        )
        result[f"allocate{n}_us_per_block"] = ns / 1e3 / (n * calls)
    return result


def run(args: argparse.Namespace) -> dict[str, Any]:
    match = bench_match(args.tokens, args.repeats, args.seed)
    scale = bench_scale(
        args.scale_blocks,
        args.groups,
        args.prefix_blocks,
        args.suffix_blocks,
        args.tokens,
        args.repeats,
        args.seed,
    )
    evict = bench_evicting_allocate(args.evict_pool, args.evict_repeats, args.seed)
    ours = match["match_numpy_ms"]
    ratios = {  # from timings interleaved in the same rounds
        "speedup_vs_vllm_sha256": match["vllm_sha256_pickle_ms"] / ours,
        "speedup_vs_vllm_xxh3_128": match["vllm_xxh3_128_pickle_ms"] / ours,
        "speedup_vs_xxh3_64_chain": match["xxh3_64_chain_ms"] / ours,
        "match_list_over_numpy": match["match_list_ms"] / ours,
    }
    values = {**match, **scale, **evict, **ratios}
    targets = {
        name: {
            "value": values[name],
            "target": limit,
            "ok": values[name] <= limit if op == "<=" else values[name] >= limit,
            "op": op,
        }
        for name, (limit, op) in TARGETS.items()
    }
    return {
        "config": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "match": match,
        "scale": scale,
        "evicting_allocate": evict,
        "ratios": ratios,
        "targets": targets,
    }


MS, US = "{:.3f} ms", "{:.2f} us"
ROWS = [  # (label, key in the merged result, format)
    ("sha256(pickle) chain match, vLLM-style", "vllm_sha256_pickle_ms", MS),
    ("xxh3_128(pickle) chain match, vLLM-style", "vllm_xxh3_128_pickle_ms", MS),
    ("plain chained xxh3_64 match", "xxh3_64_chain_ms", MS),
    ("PrefixCache.match, int32 array", "match_numpy_ms", MS),
    ("PrefixCache.match + release, int32 array", "match_release_numpy_ms", MS),
    ("PrefixCache.lookup, int32 array", "lookup_numpy_ms", MS),
    ("PrefixCache.match, list", "match_list_ms", MS),
    ("PrefixCache.insert into an empty cache", "insert_empty_ms", MS),
    ("speedup vs sha256(pickle)", "speedup_vs_vllm_sha256", "{:.0f}x"),
    ("speedup vs xxh3_128(pickle)", "speedup_vs_vllm_xxh3_128", "{:.0f}x"),
    ("speedup vs plain xxh3_64 chain", "speedup_vs_xxh3_64_chain", "{:.1f}x"),
    ("cached blocks (scale run)", "cached_blocks", "{:,}"),
    ("index bytes per cached block", "bytes_per_cached_block", "{:.1f} B"),
    ("match in the big cache", "match_big_ms", MS),
    ("match in a small cache (same run)", "match_small_ms", MS),
    ("big / small", "match_big_over_small", "{:.2f}x"),
    ("evicting allocate(1), per block", "allocate1_us_per_block", US),
    ("evicting allocate(16), per block", "allocate16_us_per_block", US),
]


def render(result: dict[str, Any]) -> Table:
    values = {**result["match"], **result["scale"], **result["evicting_allocate"]}
    values.update(result["ratios"])
    table = Table(
        title=f"prefixcache core: {result['match']['num_tokens']:,}-token prompt, "
        f"block size {BLOCK_SIZE}"
    )
    table.add_column("measure")
    table.add_column("value", justify="right")
    table.add_column("target", justify="right")
    for label, key, fmt in ROWS:
        target = result["targets"].get(key)
        verdict = ""
        if target is not None:
            verdict = f"{target['op']} {target['target']:g} " + ("ok" if target["ok"] else "MISSED")
        table.add_row(label, fmt.format(values[key]), verdict)
    return table


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=int, default=32_768, help="prompt length for match")
    parser.add_argument("--repeats", type=int, default=100, help="rounds of the match timings")
    parser.add_argument("--scale-blocks", type=int, default=1_000_000)
    parser.add_argument("--groups", type=int, default=1000, help="shared prefixes (scale run)")
    parser.add_argument("--prefix-blocks", type=int, default=64)
    parser.add_argument("--suffix-blocks", type=int, default=8)
    parser.add_argument("--evict-pool", type=int, default=65_536, help="blocks in the full pool")
    parser.add_argument("--evict-repeats", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quick", action="store_true", help="small sizes (smoke test)")
    parser.add_argument("--out", type=Path, default=Path("results/prefixcache_bench.json"))
    args = parser.parse_args(argv)
    if args.quick:
        args.repeats, args.scale_blocks, args.groups = 20, 20_000, 50
        args.evict_pool, args.evict_repeats = 4096, 3
    return args


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    result = run(args)
    Console().print(render(result))
    write_json(args.out, result)
    return result


if __name__ == "__main__":
    main(sys.argv[1:])
