"""Triton kernels on a CUDA GPU: decode bandwidth against the GPU's peak, prefill against SDPA.

Measured side by side in one run (CUDA only; exits with status 2 and a message without one):
1. ``paged_decode_attention`` (split-K): achieved bandwidth = bytes of K and V read (plus q
   and out) / kernel time, against (a) the datasheet peak of the GPU (table below or
   ``--peak-gbps``) and (b) the bandwidth of a large device-to-device copy measured here;
   for bf16, fp8 and int8 pools, several batch sizes and lengths up to 128K tokens.
2. ``paged_prefill_attention`` against ``torch.nn.functional.scaled_dot_product_attention`` on
   the same shapes (contiguous K/V for SDPA; paged, block-scattered K/V for ours); with no
   context (causal) and with a cached context (SDPA then needs an explicit mask).
3. Decode of a sliding-window layer (``--window``) beside a global one at growing contexts.
Every shape is first checked against the torch reference. Times: ``triton.testing.do_bench``
medians.

    python benchmarks/kernels_gpu.py [--quick] [--out results/kernels_gpu.json]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from bench_report import write_json

PEAK_GBPS = {  # datasheet HBM/GDDR bandwidth, GB/s (1e9 bytes)
    "H200": 4800, "H100 SXM": 3350, "H100 PCIe": 2000, "H100": 3350, "A100-SXM4-80GB": 2039,
    "A100 80GB PCIe": 1935, "A100": 1555, "L40S": 864, "L4": 300, "RTX 4090": 1008, "A10": 600,
}
DTYPES = ("auto", "fp8", "int8")


def datasheet_peak(name: str) -> float | None:
    for key, value in PEAK_GBPS.items():  # most specific names first
        if key in name:
            return float(value)
    return None


def copy_bandwidth_gbps(bench: Any) -> float:
    """Read + write bandwidth of a 2 GiB device-to-device copy."""
    src = torch.empty(1 << 30, dtype=torch.float16, device="cuda")
    dst = torch.empty_like(src)
    ms = bench(lambda: dst.copy_(src))
    return 2 * src.numel() * src.element_size() / ms / 1e6


def paged_pool(num_seqs: int, seq_len: int, kv_heads: int, head_dim: int, block_size: int,
               kv_cache_dtype: str, spare_blocks: int = 64) -> dict[str, torch.Tensor]:
    """A pool whose sequences occupy shuffled blocks at the top of the pool."""
    from prefixcache.kernels.quantization import kv_storage_dtype

    per_seq = -(-seq_len // block_size)
    num_blocks = num_seqs * per_seq + spare_blocks
    shape = (num_blocks, block_size, kv_heads, head_dim)
    dtype = kv_storage_dtype(kv_cache_dtype, torch.bfloat16)
    k_cache = (torch.randn(shape, device="cuda", dtype=torch.bfloat16) * 4).to(dtype)
    v_cache = (torch.randn(shape, device="cuda", dtype=torch.bfloat16) * 4).to(dtype)
    ids = torch.randperm(num_seqs * per_seq, device="cuda") + spare_blocks
    tables = ids.view(num_seqs, per_seq).to(torch.int32)
    scale = None if kv_cache_dtype == "auto" else torch.full((kv_heads,), 0.05, device="cuda")
    return {"k_cache": k_cache, "v_cache": v_cache, "block_tables": tables, "scale": scale}


def bench_decode(bench: Any, args: argparse.Namespace, peak: float | None, copy_peak: float
                 ) -> list[dict[str, Any]]:
    from prefixcache.kernels import paged_decode_attention
    from prefixcache.kernels.reference.paged_attention import paged_decode_attention_reference

    rows = []
    for kv_cache_dtype in DTYPES:
        for num_seqs, seq_len in args.decode_shapes:
            pool = paged_pool(num_seqs, seq_len, args.kv_heads, args.head_dim, args.block_size,
                              kv_cache_dtype)
            q = torch.randn(num_seqs, args.heads, args.head_dim, device="cuda",
                            dtype=torch.bfloat16)
            lens = torch.full((num_seqs,), seq_len, dtype=torch.int32, device="cuda")
            call_args = (q, pool["k_cache"], pool["v_cache"], pool["block_tables"], lens,
                         args.head_dim**-0.5, pool["scale"], pool["scale"])
            got = paged_decode_attention(*call_args)
            if num_seqs * seq_len <= 65536:  # the reference materialises the gathered KV
                expected = paged_decode_attention_reference(*call_args)
                torch.testing.assert_close(got.float(), expected.float(), atol=3e-2, rtol=3e-2)
            ms = bench(lambda a=call_args: paged_decode_attention(*a))
            kv_bytes = 2 * num_seqs * seq_len * args.kv_heads * args.head_dim
            kv_bytes *= pool["k_cache"].element_size()
            total = kv_bytes + 2 * q.numel() * q.element_size()
            gbps = total / ms / 1e6
            rows.append({
                "kv_cache_dtype": kv_cache_dtype, "num_seqs": num_seqs, "seq_len": seq_len,
                "ms": ms, "gbps": gbps, "of_copy_peak": gbps / copy_peak,
                "of_datasheet_peak": None if peak is None else gbps / peak,
            })
            print(f"decode {kv_cache_dtype:5} seqs={num_seqs:3d} len={seq_len:6d} "
                  f"{ms * 1e3:8.1f} us {gbps:7.0f} GB/s = {gbps / copy_peak:5.1%} of copy"
                  + ("" if peak is None else f", {gbps / peak:5.1%} of datasheet"))
            del pool
    return rows


def bench_sliding_decode(bench: Any, args: argparse.Namespace) -> list[dict[str, Any]]:
    """Decode of 8 sequences at growing contexts, every key (a global layer) against the last
    ``--window`` keys (a sliding layer): the sliding layer's time should not grow."""
    from prefixcache.kernels import paged_decode_attention
    from prefixcache.kernels.reference.paged_attention import paged_decode_attention_reference

    rows = []
    for seq_len in args.sliding_contexts:
        pool = paged_pool(8, seq_len, args.kv_heads, args.head_dim, args.block_size, "auto")
        q = torch.randn(8, args.heads, args.head_dim, device="cuda", dtype=torch.bfloat16)
        lens = torch.full((8,), seq_len, dtype=torch.int32, device="cuda")
        call_args = (q, pool["k_cache"], pool["v_cache"], pool["block_tables"], lens,
                     args.head_dim**-0.5, None, None)
        got = paged_decode_attention(*call_args, args.window)
        expected = paged_decode_attention_reference(*call_args, args.window)
        torch.testing.assert_close(got.float(), expected.float(), atol=3e-2, rtol=3e-2)
        global_ms = bench(lambda a=call_args: paged_decode_attention(*a))
        sliding_ms = bench(lambda a=call_args: paged_decode_attention(*a, args.window))
        rows.append({"seq_len": seq_len, "window": args.window, "global_ms": global_ms,
                     "sliding_ms": sliding_ms})
        print(f"decode seqs=8 len={seq_len:6d} global {global_ms * 1e3:8.1f} us, window "
              f"{args.window} {sliding_ms * 1e3:8.1f} us")
        del pool
    return rows


def bench_prefill(bench: Any, args: argparse.Namespace) -> list[dict[str, Any]]:
    from prefixcache.kernels import paged_prefill_attention
    from prefixcache.kernels.reference.paged_attention import paged_prefill_attention_reference

    rows = []
    heads, kv_heads, dim = args.heads, args.kv_heads, args.head_dim
    for num_seqs, new, context in args.prefill_shapes:
        pool = paged_pool(num_seqs, max(context, 1), kv_heads, dim, args.block_size, "auto")
        q = torch.randn(num_seqs * new, heads, dim, device="cuda", dtype=torch.bfloat16)
        k = torch.randn(num_seqs * new, kv_heads, dim, device="cuda", dtype=torch.bfloat16)
        v = torch.randn_like(k)
        starts = torch.arange(0, num_seqs * new + 1, new, dtype=torch.int32, device="cuda")
        contexts = torch.full((num_seqs,), context, dtype=torch.int32, device="cuda")
        ours_args = (q, k, v, pool["k_cache"], pool["v_cache"], pool["block_tables"], starts,
                     contexts, dim**-0.5)
        got = paged_prefill_attention(*ours_args)
        expected = paged_prefill_attention_reference(*ours_args)
        torch.testing.assert_close(got.float(), expected.float(), atol=3e-2, rtol=3e-2)
        # SDPA on the same math with contiguous K/V: [seqs, heads, context + new, dim]
        total = context + new
        qs = q.view(num_seqs, new, heads, dim).transpose(1, 2)
        ks = torch.randn(num_seqs, kv_heads, total, dim, device="cuda", dtype=torch.bfloat16)
        vs = torch.randn_like(ks)
        mask = None
        if context:
            rows_idx = torch.arange(new, device="cuda")[:, None] + context
            mask = torch.arange(total, device="cuda")[None, :] <= rows_idx  # [new, total]

        def sdpa(qs=qs, ks=ks, vs=vs, mask=mask):
            return F.scaled_dot_product_attention(
                qs, ks, vs, attn_mask=mask, is_causal=mask is None, enable_gqa=True
            )

        ours_ms = bench(lambda a=ours_args: paged_prefill_attention(*a))
        sdpa_ms = bench(sdpa)
        rows.append({"num_seqs": num_seqs, "new_tokens": new, "context": context,
                     "ours_ms": ours_ms, "sdpa_ms": sdpa_ms, "ours_over_sdpa": ours_ms / sdpa_ms})
        print(f"prefill seqs={num_seqs} new={new:5d} context={context:5d} ours {ours_ms:7.3f} ms "
              f"sdpa {sdpa_ms:7.3f} ms  ours/sdpa = {ours_ms / sdpa_ms:5.2f}")
    return rows


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--heads", type=int, default=32)
    parser.add_argument("--kv-heads", type=int, default=8)
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--window", type=int, default=1024, help="the sliding layer's window")
    parser.add_argument("--peak-gbps", type=float, default=None, help="override the table")
    parser.add_argument("--quick", action="store_true", help="few small shapes")
    parser.add_argument("--out", type=Path, default=Path("results/kernels_gpu.json"))
    args = parser.parse_args(argv)
    if args.quick:
        args.decode_shapes = [(8, 1024), (1, 8192)]
        args.prefill_shapes = [(2, 256, 0), (2, 128, 512)]
        args.sliding_contexts = [4096, 16384]
    else:
        args.decode_shapes = [(1, 4096), (1, 131072), (8, 4096), (32, 2048), (64, 8192),
                              (128, 1024)]
        args.prefill_shapes = [(1, 4096, 0), (4, 1024, 0), (4, 512, 2048), (1, 1024, 16384)]
        args.sliding_contexts = [4096, 32768]
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if not torch.cuda.is_available():
        print("kernels_gpu.py needs a CUDA GPU; none is visible here.", file=sys.stderr)
        return 2
    import triton.testing

    def bench(fn: Any) -> float:
        return float(triton.testing.do_bench(fn, warmup=25, rep=100))

    name = torch.cuda.get_device_name()
    peak = args.peak_gbps or datasheet_peak(name)
    copy_peak = copy_bandwidth_gbps(bench)
    print(f"{name}: datasheet {peak} GB/s, measured copy {copy_peak:.0f} GB/s")
    result = {
        "config": {k: v for k, v in vars(args).items() if k != "out"} | {"device": name},
        "datasheet_peak_gbps": peak, "copy_gbps": copy_peak,
        "decode": bench_decode(bench, args, peak, copy_peak),
        "prefill": bench_prefill(bench, args),
        "sliding_decode": bench_sliding_decode(bench, args),
    }
    write_json(args.out, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
