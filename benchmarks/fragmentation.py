"""KV memory fragmentation: contiguous max-length reservation vs paged blocks, same memory.

A seeded trace of mixed-length requests (lognormal prompt and output lengths, clipped to
max_model_len) is replayed, all requests queued at t=0, against two allocators that share the
same KV memory of N token slots:

* contiguous: each admitted request reserves max_model_len slots until it finishes;
* paged: each request holds ceil(tokens / block_size) blocks of a `prefixcache.PrefixCache`,
  one more allocated whenever its last block fills, all released at completion. When a block
  cannot be had, the newest running request is preempted (blocks released, re-queued first,
  recomputed on readmission), as a paged engine does.

Default trace: 2,000 requests, prompt median 512 tokens and output median 128 (lognormal,
sigma 1), memory N = 64 x 4096 slots. One step = prefill of newly admitted prompts + one
decoded token per running request.
Reported per allocator: time-averaged utilization (tokens stored / slots reserved, summed over
steps), occupancy (tokens stored / N), max and mean concurrent requests, steps to drain the
trace, preemptions. Paged/contiguous ratios come from the same run.

    python benchmarks/fragmentation.py [--quick] [--out results/fragmentation.json]
"""

from __future__ import annotations

import argparse
import sys
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from bench_report import write_json
from request_trace import Request, make_trace, trace_summary
from rich.console import Console
from rich.table import Table

from prefixcache import CacheFull, PrefixCache
from prefixcache.sizing import format_binary_bytes, kv_cache_bytes


class Allocator(Protocol):
    """What the replay loop needs from a memory policy; `seq` is a running request's state."""

    def try_admit(self, seq: RunningRequest) -> bool: ...
    def grow(self, seq: RunningRequest) -> bool: ...  # room for one more token; False = no memory
    def free(self, seq: RunningRequest) -> None: ...
    def reserved_slots(self) -> int: ...


@dataclass
class RunningRequest:
    """A request being served: its KV holds prompt + generated tokens (blocks: paged only)."""

    request: Request
    generated: int = 0
    blocks: list[int] | None = None

    @property
    def length(self) -> int:
        return self.request.prompt_len + self.generated


class ContiguousAllocator:
    """Every request reserves max_model_len slots from a budget of `num_slots`."""

    def __init__(self, num_slots: int, max_model_len: int) -> None:
        self.num_slots = num_slots
        self.max_model_len = max_model_len
        self.in_use = 0

    def try_admit(self, seq: RunningRequest) -> bool:
        if self.in_use + self.max_model_len > self.num_slots:
            return False
        self.in_use += self.max_model_len
        return True

    def grow(self, seq: RunningRequest) -> bool:
        return True  # the reservation already covers max_model_len tokens

    def free(self, seq: RunningRequest) -> None:
        self.in_use -= self.max_model_len

    def reserved_slots(self) -> int:
        return self.in_use


class PagedAllocator:
    """Blocks from a PrefixCache; admission keeps `watermark_blocks` free for decode growth."""

    def __init__(self, cache: PrefixCache, block_size: int, watermark_blocks: int) -> None:
        self.cache = cache
        self.block_size = block_size
        self.watermark_blocks = watermark_blocks
        self.blocks_held = 0

    def try_admit(self, seq: RunningRequest) -> bool:
        needed = -(-seq.length // self.block_size)
        if self.cache.stats()["free"] - needed < self.watermark_blocks:
            return False
        seq.blocks = [int(b) for b in self.cache.allocate(needed)]
        self.blocks_held += needed
        return True

    def grow(self, seq: RunningRequest) -> bool:
        assert seq.blocks is not None
        if seq.length < len(seq.blocks) * self.block_size:
            return True
        try:
            seq.blocks.extend(int(b) for b in self.cache.allocate(1))
        except CacheFull:
            return False
        self.blocks_held += 1
        return True

    def free(self, seq: RunningRequest) -> None:
        assert seq.blocks is not None
        self.cache.release(seq.blocks)
        self.blocks_held -= len(seq.blocks)
        seq.blocks = None

    def reserved_slots(self) -> int:
        in_use = self.cache.stats()["in_use"]
        assert in_use == self.blocks_held, (
            f"pool says {in_use} blocks in use, we hold {self.blocks_held}"
        )
        return in_use * self.block_size


def replay(trace: list[Request], allocator: Allocator, num_slots: int) -> dict[str, float]:
    """Run the trace to completion; return utilization, concurrency and step figures.

    `running` is kept in admission order, so the newest request (the preemption victim) is
    last; victims go back to the front of the queue, oldest first.
    """
    waiting: deque[RunningRequest] = deque(RunningRequest(r) for r in trace)
    running: list[RunningRequest] = []
    steps = stored_sum = reserved_sum = concurrent_sum = 0
    max_concurrent = preemptions = recomputed_tokens = completed = 0
    busy_steps = busy_stored_sum = busy_concurrent_sum = 0  # steps that ended with a queue
    while waiting or running:
        while waiting and allocator.try_admit(waiting[0]):
            running.append(waiting.popleft())
        if not running:
            raise RuntimeError(
                f"a {waiting[0].length}-token request never fits in {num_slots} slots"
            )
        i = 0
        while i < len(running):
            seq = running[i]
            if allocator.grow(seq):
                seq.generated += 1
                i += 1
                continue
            victim = running.pop()  # the newest; may be `seq` itself, which ends the loop
            allocator.free(victim)
            waiting.appendleft(victim)
            preemptions += 1
            recomputed_tokens += victim.length
        steps += 1
        stored = sum(seq.length for seq in running)
        stored_sum += stored
        reserved_sum += allocator.reserved_slots()
        concurrent_sum += len(running)
        max_concurrent = max(max_concurrent, len(running))
        if waiting:
            busy_steps += 1
            busy_stored_sum += stored
            busy_concurrent_sum += len(running)
        finished = [seq for seq in running if seq.generated >= seq.request.output_len]
        for seq in finished:
            allocator.free(seq)
        completed += len(finished)
        if finished:
            running = [seq for seq in running if seq.generated < seq.request.output_len]
    assert completed == len(trace), (completed, len(trace))
    return {
        "steps": steps,
        "utilization": stored_sum / reserved_sum,
        "occupancy": stored_sum / (steps * num_slots),
        "max_concurrent": max_concurrent,
        "mean_concurrent": concurrent_sum / steps,
        "saturated_steps": busy_steps,
        "saturated_occupancy": busy_stored_sum / max(busy_steps * num_slots, 1),
        "saturated_mean_concurrent": busy_concurrent_sum / max(busy_steps, 1),
        "preemptions": preemptions,
        "recomputed_tokens": recomputed_tokens,
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Replay the same trace against both allocators; return the JSON-ready result."""
    if args.num_slots % args.block_size or args.num_slots < args.max_model_len:
        raise SystemExit("--num-slots must be a multiple of --block-size and >= --max-model-len")
    trace = make_trace(args.requests, args.max_model_len, args.seed)
    num_blocks = args.num_slots // args.block_size
    watermark = max(1, round(num_blocks * args.watermark))
    contiguous = replay(
        trace, ContiguousAllocator(args.num_slots, args.max_model_len), args.num_slots
    )
    cache = PrefixCache(num_blocks=num_blocks, block_size=args.block_size)
    paged = replay(trace, PagedAllocator(cache, args.block_size, watermark), args.num_slots)
    cache.check_invariants()
    end_stats = cache.stats()
    assert end_stats["in_use"] == 0 and end_stats["free"] == num_blocks, end_stats
    return {
        "config": {
            "seed": args.seed,
            "num_slots": args.num_slots,
            "max_model_len": args.max_model_len,
            "block_size": args.block_size,
            "num_blocks": num_blocks,
            "watermark_blocks": watermark,
            "kv_bytes_if_llama_8b_bf16": kv_cache_bytes(32, 8, 128, "bf16", args.num_slots),
            "quick": args.quick,
        },
        "trace": trace_summary(trace),
        "contiguous": contiguous,
        "paged": paged,
        "ratios": {
            "max_concurrent": paged["max_concurrent"] / contiguous["max_concurrent"],
            "mean_concurrent": paged["mean_concurrent"] / contiguous["mean_concurrent"],
            "utilization": paged["utilization"] / contiguous["utilization"],
            "saturated_mean_concurrent": paged["saturated_mean_concurrent"]
            / contiguous["saturated_mean_concurrent"],
            "steps_contiguous_over_paged": contiguous["steps"] / paged["steps"],
        },
    }


def render(result: dict[str, Any]) -> Table:
    cfg, contiguous, paged = result["config"], result["contiguous"], result["paged"]
    table = Table(
        title=(
            f"{result['trace']['requests']:,} requests, {cfg['num_slots']:,} KV token slots, "
            f"max_model_len {cfg['max_model_len']}, block size {cfg['block_size']}"
        ),
        caption=(
            "saturated = steps that ended with requests still queued; "
            f"N slots = {format_binary_bytes(cfg['kv_bytes_if_llama_8b_bf16'])} "
            "of KV for Llama-8B bf16"
        ),
    )
    table.add_column("metric")
    table.add_column("contiguous", justify="right")
    table.add_column("paged", justify="right")
    table.add_column("paged / contiguous", justify="right")
    rows = [
        ("utilization (stored / reserved)", "utilization", "{:.1%}"),
        ("occupancy (stored / N slots)", "occupancy", "{:.1%}"),
        ("max concurrent requests", "max_concurrent", "{:,}"),
        ("mean concurrent requests", "mean_concurrent", "{:.1f}"),
        ("occupancy, saturated", "saturated_occupancy", "{:.1%}"),
        ("mean concurrent, saturated", "saturated_mean_concurrent", "{:.1f}"),
        ("steps to drain the trace", "steps", "{:,}"),
        ("preemptions", "preemptions", "{:,}"),
    ]
    for label, key, fmt in rows:
        ratio = f"{paged[key] / contiguous[key]:.2f}x" if contiguous[key] else "-"
        table.add_row(label, fmt.format(contiguous[key]), fmt.format(paged[key]), ratio)
    return table


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--num-slots", type=int, default=64 * 4096, help="KV memory, in tokens")
    parser.add_argument("--max-model-len", type=int, default=4096)
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument(
        "--watermark", type=float, default=0.01, help="fraction of blocks kept free at admission"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quick", action="store_true", help="small trace and memory (smoke test)")
    parser.add_argument("--out", type=Path, default=Path("results/fragmentation.json"))
    args = parser.parse_args(argv)
    if args.quick:
        args.requests, args.num_slots = 200, 8 * args.max_model_len
    return args


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    result = run(args)
    Console().print(render(result))
    write_json(args.out, result)
    return result


if __name__ == "__main__":
    main(sys.argv[1:])
