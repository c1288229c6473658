"""CPU paged attention: the compiled AVX-512/BF16 kernel against the torch reference and SDPA.

Four cases with SmolLM2-135M shapes (9 query heads over 3 kv heads, head_dim 64, bf16,
block size 16), each timed side by side in one run (the variants interleaved per repeat,
medians reported):

1. cold prefill: one sequence, 1,637 new tokens, no cached context (causal);
2. warm prefill: 64 new tokens over 1,637 cached tokens;
3. batched decode: 32 sequences, one query each, 300-400 cached tokens each;
4. decode of one sequence over 1,701 cached tokens (the kernel splits its keys: split-K);
5. that decode through a forward pass's 30 pools, one per layer, in turn, with 8 MB written
   between calls as a layer's GEMMs stream their weights: each call finds its pool out of
   cache, as the engine's decode steps do (kernel and SDPA, ms per layer).

Interleaving means each variant starts with caches holding the other variants' data, as in a
model forward; the kernel is also timed back to back on its own (hot caches) for reference.

Variants: ``kernel`` (``paged_*_attention_cpu``: paged pool, shuffled block ids, q/k/v as
strided slices of a fused qkv tensor), ``reference`` (``paged_*_attention_reference`` on the
same inputs) and ``sdpa`` (``scaled_dot_product_attention`` on contiguous tensors, K/V already
laid out per head: the cold case with K/V expanded to 9 heads and ``is_causal``, the warm case
with each kv head's query group folded into the query axis and an additive mask, decode as
the warm case with one query); then ``kernel_int8`` / ``reference_int8`` and ``kernel_fp8`` /
``reference_fp8``: the same calls over the pool quantized to int8 / fp8 e4m3fn with
per-channel scales ([kv_heads, head_dim], as the engine calibrates them) and the new tokens'
k/v still bf16, so the cold case, which reads no cached token, does the same work as with bf16.
The ``vs ref`` column compares each variant with the reference over the same pool.
FLOPs: 4 * heads * head_dim * (query, visible key) pairs.

    python benchmarks/cpu_attention.py [--threads 2] [--repeats 15] \
        [--out results/cpu_attention.json]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from bench_report import write_json

from prefixcache.kernels.cpu import (
    cpu_attention_available,
    paged_decode_attention_cpu,
    paged_prefill_attention_cpu,
)
from prefixcache.kernels.quantization import FP8_DTYPE, quantize, scales_from_amax
from prefixcache.kernels.reference.paged_attention import (
    paged_decode_attention_reference,
    paged_prefill_attention_reference,
)

HEADS, KV_HEADS, HEAD_DIM, BLOCK_SIZE = 9, 3, 64, 16
GROUP = HEADS // KV_HEADS
SCALE = HEAD_DIM**-0.5
QUANTIZED = {"int8": torch.int8, "fp8": FP8_DTYPE}  # variant suffix -> pool dtype


def paged_pool(
    lengths: list[int], generator: torch.Generator, spare_blocks: int = 512
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """A bf16 pool holding random k/v for ``lengths`` tokens at shuffled block ids.

    Returns k_cache, v_cache [num_blocks, block_size, kv_heads, dim], block_tables
    [num_seqs, max_blocks] int32, and the sequences' keys and values gathered contiguously
    per kv head [num_seqs, kv_heads, max_len, dim] (zero padded) for SDPA.
    """
    per_seq = [-(-n // BLOCK_SIZE) for n in lengths]
    num_blocks = sum(per_seq) + spare_blocks
    shape = (num_blocks, BLOCK_SIZE, KV_HEADS, HEAD_DIM)
    k_cache = torch.randn(shape, generator=generator).bfloat16()
    v_cache = torch.randn(shape, generator=generator).bfloat16()
    ids = torch.randperm(num_blocks, generator=generator)[: sum(per_seq)].to(torch.int32)
    tables = torch.zeros(len(lengths), max(per_seq), dtype=torch.int32)
    max_len = max(lengths)
    dense = torch.zeros(2, len(lengths), KV_HEADS, max_len, HEAD_DIM, dtype=torch.bfloat16)
    start = 0
    for seq, (length, count) in enumerate(zip(lengths, per_seq, strict=True)):
        tables[seq, :count] = ids[start : start + count]
        start += count
        for i, cache in enumerate((k_cache, v_cache)):
            rows = cache[tables[seq, :count].long()].reshape(-1, KV_HEADS, HEAD_DIM)[:length]
            dense[i, seq, :, :length] = rows.transpose(0, 1)
    return k_cache, v_cache, tables, dense[0], dense[1]


def quantized_pool(
    k_cache: torch.Tensor,  # [num_blocks, block_size, kv_heads, dim] bf16
    v_cache: torch.Tensor,  # [num_blocks, block_size, kv_heads, dim] bf16
    dtype: torch.dtype,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The pool stored as ``dtype`` (int8 or fp8) with per-channel scales from its absolute
    maxima: k_cache, v_cache [num_blocks, block_size, kv_heads, dim], k_scale, v_scale
    [kv_heads, dim] float32."""
    k_scale = scales_from_amax(k_cache.float().abs().amax((0, 1)), dtype, 1.0)
    v_scale = scales_from_amax(v_cache.float().abs().amax((0, 1)), dtype, 1.0)
    return quantize(k_cache, k_scale, dtype), quantize(v_cache, v_scale, dtype), k_scale, v_scale


def kernel_case(
    name: str,
    pairs: int,
    sdpa: Callable[[], Any],
    kernel: Callable[..., Any],
    reference: Callable[..., Any],
    args: tuple,
    pool_at: int,
) -> dict[str, Any]:
    """One benchmark case: ``kernel`` and ``reference`` on the bf16 pool, ``sdpa`` on dense
    tensors, then ``kernel_<q>`` / ``reference_<q>`` for each quantized pool dtype, with a
    kernel-vs-reference check per pool. ``args`` are the bf16 call's, with k_cache, v_cache
    at ``pool_at`` and ``pool_at + 1``; the quantized calls append k_scale, v_scale."""
    variants: dict[str, Callable[[], Any]] = {
        "kernel": lambda: kernel(*args),
        "reference": lambda: reference(*args),
        "sdpa": sdpa,
    }
    checks = {"bf16": (variants["kernel"], variants["reference"])}
    for suffix, dtype in QUANTIZED.items():
        k_cache, v_cache, k_scale, v_scale = quantized_pool(*args[pool_at : pool_at + 2], dtype)
        quant = (*args[:pool_at], k_cache, v_cache, *args[pool_at + 2 :], k_scale, v_scale)
        variants[f"kernel_{suffix}"] = lambda a=quant: kernel(*a)
        variants[f"reference_{suffix}"] = lambda a=quant: reference(*a)
        checks[suffix] = (variants[f"kernel_{suffix}"], variants[f"reference_{suffix}"])
    return {"name": name, "pairs": pairs, "variants": variants, "checks": checks}


def fused_qkv(tokens: int, generator: torch.Generator) -> tuple[torch.Tensor, ...]:
    """q [T, heads, dim], k and v [T, kv_heads, dim]: strided slices of one qkv tensor."""
    qkv = torch.randn(tokens, HEADS + 2 * KV_HEADS, HEAD_DIM, generator=generator).bfloat16()
    return qkv[:, :HEADS], qkv[:, HEADS : HEADS + KV_HEADS], qkv[:, HEADS + KV_HEADS :]


def folded_sdpa(
    q: torch.Tensor,  # [kv_heads, rows, dim] contiguous: query tokens x group heads per kv head
    k: torch.Tensor,  # [kv_heads, keys, dim]
    v: torch.Tensor,  # [kv_heads, keys, dim]
    mask: torch.Tensor,  # [rows, keys] additive
) -> torch.Tensor:  # [kv_heads, rows, dim]
    return F.scaled_dot_product_attention(
        q[None], k[None], v[None], attn_mask=mask[None, None], scale=SCALE
    )[0]


def cold_prefill(generator: torch.Generator) -> dict[str, Any]:
    tokens = 1637
    q, k, v = fused_qkv(tokens, generator)
    k_cache, v_cache, tables, _, _ = paged_pool([1], generator)
    starts = torch.tensor([0, tokens], dtype=torch.int32)
    context = torch.zeros(1, dtype=torch.int32)
    args = (q, k, v, k_cache, v_cache, tables, starts, context, SCALE)
    q4 = q.transpose(0, 1)[None].contiguous()  # [1, heads, T, dim]
    k4 = k.repeat_interleave(GROUP, 1).transpose(0, 1)[None].contiguous()
    v4 = v.repeat_interleave(GROUP, 1).transpose(0, 1)[None].contiguous()
    return kernel_case(
        "cold prefill (1637 new tokens, causal)",
        tokens * (tokens + 1) // 2,
        lambda: F.scaled_dot_product_attention(q4, k4, v4, is_causal=True, scale=SCALE),
        paged_prefill_attention_cpu,
        paged_prefill_attention_reference,
        args,
        3,
    )


def warm_prefill(generator: torch.Generator) -> dict[str, Any]:
    context, new = 1637, 64
    q, k, v = fused_qkv(new, generator)
    k_cache, v_cache, tables, dense_k, dense_v = paged_pool([context], generator)
    starts = torch.tensor([0, new], dtype=torch.int32)
    context_lens = torch.tensor([context], dtype=torch.int32)
    args = (q, k, v, k_cache, v_cache, tables, starts, context_lens, SCALE)
    keys = torch.cat([dense_k[0], k.transpose(0, 1)], dim=1).contiguous()  # [kv, C + new, dim]
    values = torch.cat([dense_v[0], v.transpose(0, 1)], dim=1).contiguous()
    folded = q.reshape(new, KV_HEADS, GROUP, HEAD_DIM).permute(1, 0, 2, 3)
    folded = folded.reshape(KV_HEADS, new * GROUP, HEAD_DIM).contiguous()
    rows = torch.arange(new).repeat_interleave(GROUP)[:, None] + context
    mask = torch.zeros(new * GROUP, context + new, dtype=torch.bfloat16)
    mask.masked_fill_(torch.arange(context + new)[None, :] > rows, float("-inf"))
    return kernel_case(
        "warm prefill (64 new over 1637 cached)",
        new * context + new * (new + 1) // 2,
        lambda: folded_sdpa(folded, keys, values, mask),
        paged_prefill_attention_cpu,
        paged_prefill_attention_reference,
        args,
        3,
    )


def decode_case(name: str, lengths: torch.Tensor, generator: torch.Generator) -> dict[str, Any]:
    """One query per sequence over ``lengths`` [seqs] cached tokens."""
    seqs = lengths.shape[0]
    k_cache, v_cache, tables, dense_k, dense_v = paged_pool(lengths.tolist(), generator, 4096)
    q = torch.randn(seqs, HEADS, HEAD_DIM, generator=generator).bfloat16()
    seq_lens = lengths.to(torch.int32)
    args = (q, k_cache, v_cache, tables, seq_lens, SCALE)
    grouped = q.reshape(seqs, KV_HEADS, GROUP, HEAD_DIM).contiguous()  # [seqs, kv, group, dim]
    visible = torch.arange(dense_k.shape[2])[None, :] < lengths[:, None]
    mask = torch.zeros(visible.shape, dtype=torch.bfloat16).masked_fill_(~visible, float("-inf"))
    mask = mask[:, None, None, :]  # [seqs, 1, 1, max_len]
    sdpa_kwargs = {"attn_mask": mask, "scale": SCALE}
    return kernel_case(
        name,
        int(lengths.sum()),
        lambda: F.scaled_dot_product_attention(grouped, dense_k, dense_v, **sdpa_kwargs),
        paged_decode_attention_cpu,
        paged_decode_attention_reference,
        args,
        1,
    )


def batched_decode(generator: torch.Generator) -> dict[str, Any]:
    lengths = torch.randint(300, 401, (32,), generator=generator)
    return decode_case("batched decode (32 seqs x 300-400 cached)", lengths, generator)


def single_decode(generator: torch.Generator) -> dict[str, Any]:
    """One sequence: the kernel splits each kv head's keys into chunks (split-K)."""
    return decode_case("decode (1 seq x 1701 cached)", torch.tensor([1701]), generator)


FORWARD_LAYERS = 30  # SmolLM2's


def forward_pass_decode(generator: torch.Generator, repeats: int) -> dict[str, Any]:
    """Case 5: one query over 1,701 cached tokens in each of FORWARD_LAYERS pools in turn."""
    layers = []
    for _ in range(FORWARD_LAYERS):
        k_cache, v_cache, tables, dense_k, dense_v = paged_pool([1701], generator, 16)
        q = torch.randn(1, HEADS, HEAD_DIM, generator=generator).bfloat16()
        grouped = q.reshape(1, KV_HEADS, GROUP, HEAD_DIM).contiguous()
        paged = (q, k_cache, v_cache, tables, torch.tensor([1701], dtype=torch.int32), SCALE)
        layers.append((paged, (grouped, dense_k, dense_v)))
    variants = {
        "kernel": lambda paged, dense: paged_decode_attention_cpu(*paged),
        "sdpa": lambda paged, dense: F.scaled_dot_product_attention(*dense, scale=SCALE),
    }
    weights = torch.ones(2 * 1024 * 1024)  # 8 MB, rewritten between calls
    samples: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(repeats):
        for name, fn in variants.items():
            seconds = 0.0
            for paged, dense in layers:
                weights.add_(1.0)
                start = time.perf_counter()
                fn(paged, dense)
                seconds += time.perf_counter() - start
            samples[name].append(seconds / FORWARD_LAYERS * 1e3)
    ms = {name: statistics.median(values) for name, values in samples.items()}
    name = f"decode (1 seq x 1701, {FORWARD_LAYERS} pools in turn)"
    for variant, value in ms.items():
        print(f"{name:42s} {variant:14s} {value:8.3f} {'':8s} {ms['sdpa'] / value:7.2f}x")
    return {"case": name, "kernel": {"ms": ms["kernel"]}, "sdpa": {"ms": ms["sdpa"]},
            "kernel_speedup_vs_sdpa": ms["sdpa"] / ms["kernel"]}  # fmt: skip


def time_interleaved(variants: dict[str, Callable[[], Any]], repeats: int) -> dict[str, float]:
    """Median milliseconds per variant, the variants run in turn within each repeat."""
    for fn in variants.values():  # warm up
        fn()
    samples: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(repeats):
        for name, fn in variants.items():
            start = time.perf_counter()
            fn()
            samples[name].append((time.perf_counter() - start) * 1e3)
    return {name: statistics.median(values) for name, values in samples.items()}


def reference_of(variant: str) -> str:
    """The reference variant over the same pool ("reference_int8" for "kernel_int8")."""
    _, _, pool = variant.partition("_")
    return f"reference_{pool}" if pool else "reference"


def max_errors(case: dict[str, Any]) -> dict[str, float]:
    """Max abs difference between kernel and reference per pool dtype ("max_abs_err" for
    bf16, "max_abs_err_int8", "max_abs_err_fp8")."""
    errors = {}
    for pool, (kernel, reference) in case["checks"].items():
        got, expected = kernel(), reference()
        key = "max_abs_err" if pool == "bf16" else f"max_abs_err_{pool}"
        errors[key] = (got.float() - expected.float()).abs().max().item()
    return errors


def run_case(case: dict[str, Any], repeats: int) -> dict[str, Any]:
    """Times a case's variants interleaved, then each kernel back to back; prints its table
    rows and returns its JSON row."""
    ms = time_interleaved(case["variants"], repeats)
    flops = 4 * HEADS * HEAD_DIM * case["pairs"]
    row: dict[str, Any] = {"case": case["name"], "flops": flops, **max_errors(case)}
    for name, value in ms.items():
        gflops = flops / value / 1e6
        speedup_sdpa, speedup_ref = ms["sdpa"] / value, ms[reference_of(name)] / value
        row[name] = {"ms": value, "gflops": gflops}
        print(
            f"{case['name']:42s} {name:14s} {value:8.3f} {gflops:8.1f} "
            f"{speedup_sdpa:7.2f}x {speedup_ref:7.2f}x"
        )
    for name in [name for name in ms if name.startswith("kernel")]:
        alone = time_interleaved({name: case["variants"][name]}, repeats)[name]
        row[f"{name}_back_to_back_ms"] = alone  # hot caches: the kernel repeated on its own
        label = f"({name} back to back, hot caches)"
        print(f"{case['name']:42s} {label:41s} {alone:8.3f} ms")
        row[f"{name}_speedup_vs_{reference_of(name)}"] = ms[reference_of(name)] / ms[name]
    row["kernel_speedup_vs_sdpa"] = ms["sdpa"] / ms["kernel"]
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--out", type=Path, default=Path("results/cpu_attention.json"))
    args = parser.parse_args()
    if not cpu_attention_available():
        raise SystemExit("the CPU attention kernel is unavailable on this machine")
    torch.set_num_threads(args.threads)
    generator = torch.Generator().manual_seed(0)
    results = []
    print(f"{'case':42s} {'variant':14s} {'ms':>8s} {'GFLOP/s':>8s} {'vs sdpa':>8s} {'vs ref':>8s}")
    for make in (cold_prefill, warm_prefill, batched_decode, single_decode):
        case = make(generator)
        repeats = args.repeats if case["pairs"] > 100_000 else args.repeats * 4
        results.append(run_case(case, repeats))
    results.append(forward_pass_decode(generator, args.repeats))
    meta = {
        "threads": args.threads,
        "repeats": args.repeats,
        "torch": torch.__version__,
        "heads": HEADS,
        "kv_heads": KV_HEADS,
        "head_dim": HEAD_DIM,
        "block_size": BLOCK_SIZE,
        "quantized_pools": "per-channel scales [kv_heads, head_dim]; new tokens' k/v bf16",
    }
    write_json(args.out, {"meta": meta, "cases": results})


if __name__ == "__main__":
    main()
