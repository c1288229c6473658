"""The torch reference's sliding-window attention: prefill and decode equal a dense masked
computation, and neither reads a cached block wholly outside the window (poisoned with NaN
there, the result stays finite and equal)."""

from __future__ import annotations

import itertools

import pytest
import torch
from paged_kernel_inputs import make_pool, varlen_queries

from prefixcache.kernels.cpu.windowed_attention import (
    windowed_attention_cpu,
    windowed_attention_supports,
)
from prefixcache.kernels.reference.paged_attention import (
    paged_decode_attention_reference,
    paged_prefill_attention_reference,
)


def dense(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, first_position: int,
          window: int, scale: float) -> torch.Tensor:  # fmt: skip
    """q: [new, heads, dim] at positions first_position..; keys/values: [total, kv, dim]."""
    group = q.shape[1] // keys.shape[1]
    keys = keys.repeat_interleave(group, dim=1).float()
    values = values.repeat_interleave(group, dim=1).float()
    scores = torch.einsum("nhd,thd->hnt", q.float(), keys) * scale
    rows = torch.arange(q.shape[0]).unsqueeze(1) + first_position
    cols = torch.arange(keys.shape[0]).unsqueeze(0)
    visible = (cols <= rows) & (cols > rows - window)
    scores = scores.masked_fill(~visible, float("-inf"))
    return torch.einsum("hnt,thd->nhd", torch.softmax(scores, dim=-1), values)


def poison_outside(pool, seq: int, first_seen: int, block_size: int) -> None:
    """NaN in every cached block of ``seq`` wholly before position ``first_seen``."""
    for index in range(first_seen // block_size):
        block = int(pool.block_tables[seq, index])
        pool.k_cache[block] = float("nan")
        pool.v_cache[block] = float("nan")


@pytest.mark.parametrize(("window", "contexts", "new"), [
    (24, [70, 5, 0], [9, 30, 40]),
    (300, [500, 0], [200, 330]),  # runs of 75 new tokens, each over its own keys
])
@pytest.mark.parametrize("block_size", [4, 16])
def test_prefill_sees_the_window_only(block_size: int, window: int, contexts: list[int],
                                      new: list[int]) -> None:  # fmt: skip
    q, k, v, starts = varlen_queries(new, 4, 2, 32)
    pool = make_pool(contexts, 2, 32, block_size)
    expected = []
    for seq, context in enumerate(contexts):
        cached_k = pool.k_cache[pool.block_tables[seq]].reshape(-1, 2, 32)[:context]
        cached_v = pool.v_cache[pool.block_tables[seq]].reshape(-1, 2, 32)[:context]
        span = slice(int(starts[seq]), int(starts[seq + 1]))
        expected.append(dense(q[span], torch.cat([cached_k, k[span]]),
                              torch.cat([cached_v, v[span]]), context, window, 32**-0.5))
        poison_outside(pool, seq, max(0, context - window + 1), block_size)
    got = paged_prefill_attention_reference(
        q, k, v, pool.k_cache, pool.v_cache, pool.block_tables, starts,
        torch.tensor(contexts, dtype=torch.int32), 32**-0.5, sliding_window=window,
    )  # fmt: skip
    torch.testing.assert_close(got, torch.cat(expected), atol=1e-5, rtol=1e-4)


def test_decode_sees_the_window_only() -> None:
    window, lengths = 24, [70, 9, 33]
    pool = make_pool(lengths, 2, 32, 4)
    q = torch.randn(len(lengths), 4, 32)
    expected = []
    for seq, length in enumerate(lengths):
        keys = pool.k_cache[pool.block_tables[seq]].reshape(-1, 2, 32)[:length]
        values = pool.v_cache[pool.block_tables[seq]].reshape(-1, 2, 32)[:length]
        expected.append(dense(q[seq:seq + 1], keys, values, length - 1, window, 32**-0.5))
        poison_outside(pool, seq, max(0, length - window), 4)
    got = paged_decode_attention_reference(q, pool.k_cache, pool.v_cache, pool.block_tables,
                                           torch.tensor(lengths, dtype=torch.int32), 32**-0.5,
                                           sliding_window=window)  # fmt: skip
    torch.testing.assert_close(got, torch.cat(expected), atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_token_is_the_same_in_any_chunk(dtype: torch.dtype) -> None:
    """A windowed prefill token's output does not depend on the chunk it comes in (float64
    inside, rounded once), so a cached answer can equal an uncached one bit for bit."""
    window, total, block_size = 300, 700, 16
    pool = make_pool([total], 2, 32, block_size)
    pool.k_cache, pool.v_cache = pool.k_cache.to(dtype), pool.v_cache.to(dtype)
    keys = pool.k_cache[pool.block_tables[0]].reshape(-1, 2, 32)[:total]
    values = pool.v_cache[pool.block_tables[0]].reshape(-1, 2, 32)[:total]
    q = torch.randn(total, 4, 32).to(dtype)

    def chunk(start: int, end: int) -> torch.Tensor:
        return paged_prefill_attention_reference(
            q[start:end], keys[start:end], values[start:end], pool.k_cache, pool.v_cache,
            pool.block_tables, torch.tensor([0, end - start], dtype=torch.int32),
            torch.tensor([start], dtype=torch.int32), 32**-0.5, sliding_window=window,
        )  # fmt: skip

    whole = chunk(0, total)
    bounds = [0, 1, 77, 78, 300, 451, 700]
    pieces = torch.cat([chunk(a, b) for a, b in itertools.pairwise(bounds)])
    assert torch.equal(whole, pieces)


needs_kernel = pytest.mark.skipif(
    not windowed_attention_supports(torch.zeros(1, 4, 32), torch.zeros(1, 4, 2, 32)),
    reason="the compiled float32 kernels do not run on this CPU",
)


@needs_kernel
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_compiled_kernel_sees_the_window_only(dtype: torch.dtype) -> None:
    """Each token over exactly its last ``window`` keys (the pool's blocks before them hold
    NaN), equal to a dense computation; any split of the tokens gives the same bits."""
    window, total, block_size = 40, 150, 8
    pool = make_pool([total], 2, 32, block_size)
    k_cache, v_cache = pool.k_cache.to(dtype), pool.v_cache.to(dtype)
    keys = k_cache[pool.block_tables[0].long()].reshape(-1, 2, 32)[:total]
    values = v_cache[pool.block_tables[0].long()].reshape(-1, 2, 32)[:total]
    q = torch.randn(total, 6, 32).to(dtype)
    positions = torch.arange(total)

    def run(rows: slice) -> torch.Tensor:
        count = positions[rows].numel()
        return windowed_attention_cpu(q[rows], k_cache, v_cache, pool.block_tables,
                                      torch.zeros(count, dtype=torch.int32), positions[rows],
                                      window, 32**-0.5)  # fmt: skip

    whole = run(slice(0, total))
    expected = dense(q.float(), keys.float(), values.float(), 0, window, 32**-0.5)
    tolerance = 1e-5 if dtype is torch.float32 else 1e-2
    torch.testing.assert_close(whole.float(), expected, atol=tolerance, rtol=tolerance)
    pieces = [run(slice(a, b)) for a, b in itertools.pairwise([0, 1, 41, 42, 99, 150])]
    assert torch.equal(torch.cat(pieces), whole)
    last = total - 1  # keys before its window poisoned: still the same bits
    poison_outside(pool, 0, last - window + 1, block_size)
    k_cache, v_cache = pool.k_cache.to(dtype), pool.v_cache.to(dtype)
    assert torch.equal(run(slice(last, total)), whole[last:])
