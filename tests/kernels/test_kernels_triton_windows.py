"""The Triton kernels (interpreted) with sliding windows and soft-capped scores against the
torch reference, and reading no block wholly outside the window (those hold NaN here)."""

from __future__ import annotations

import pytest
import torch
from paged_kernel_inputs import make_pool, varlen_queries
from tiny_model_factory import make_tiny_model_dir

from prefixcache.engine.llm import LLM
from prefixcache.engine.sampling_params import SamplingParams
from prefixcache.engine.sliding_slots import SlidingSlots
from prefixcache.kernels import kernel_backend
from prefixcache.kernels.reference.paged_attention import (
    paged_decode_attention_reference,
    paged_prefill_attention_reference,
)
from prefixcache.kernels.triton import (
    paged_decode_attention_triton,
    paged_prefill_attention_triton,
)

HEAD_DIM = 32
SCALE = HEAD_DIM**-0.5


def poison_before(pool, seq: int, first_seen: int, block_size: int) -> None:
    """NaN in every block of ``seq`` wholly before position ``first_seen``."""
    for index in range(first_seen // block_size):
        block = int(pool.block_tables[seq, index])
        pool.k_cache[block] = float("nan")
        pool.v_cache[block] = float("nan")


@pytest.mark.parametrize(("window", "softcap"), [(24, None), (24, 2.0), (None, 2.0)])
@pytest.mark.parametrize("block_size", [4, 16])
def test_decode_window_and_softcap_match_the_reference(block_size: int, window: int | None,
                                                       softcap: float | None) -> None:
    lengths = [70, 9, 33, 1]  # past the window, inside it, a non-multiple, one token
    pool = make_pool(lengths, 2, HEAD_DIM, block_size)
    q = torch.randn(len(lengths), 6, HEAD_DIM)
    seq_lens = torch.tensor(lengths, dtype=torch.int32)
    args = (q, pool.k_cache, pool.v_cache, pool.block_tables, seq_lens, SCALE, None, None,
            window, softcap)
    expected = paged_decode_attention_reference(*args)
    if window is not None:
        for seq, length in enumerate(lengths):
            poison_before(pool, seq, max(0, length - window), block_size)
    for splits in (1, 3):  # with 3, the short sequences have empty splits
        got = paged_decode_attention_triton(*args, num_splits=splits, block_n=16)
        torch.testing.assert_close(got, expected, atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize(("window", "softcap"), [(24, None), (24, 2.0), (None, 2.0), (40, None)])
@pytest.mark.parametrize("block_size", [4, 16])
def test_prefill_window_and_softcap_match_the_reference(block_size: int, window: int | None,
                                                        softcap: float | None) -> None:
    # a long context past the window, a short one, none; chunks of several 16-token tiles
    contexts, new = [70, 5, 0], [9, 30, 45]
    q, k, v, starts = varlen_queries(new, 6, 2, HEAD_DIM)
    pool = make_pool(contexts, 2, HEAD_DIM, block_size)
    args = (q, k, v, pool.k_cache, pool.v_cache, pool.block_tables, starts,
            torch.tensor(contexts, dtype=torch.int32), SCALE, None, None)
    expected = paged_prefill_attention_reference(*args, sliding_window=window, softcap=softcap)
    if window is not None:
        for seq, context in enumerate(contexts):
            poison_before(pool, seq, max(0, context - window + 1), block_size)
    got = paged_prefill_attention_triton(*args, window, softcap, block_m=16, block_n=16)
    torch.testing.assert_close(got, expected, atol=2e-5, rtol=1e-4)


def test_windowed_prefill_then_decode_equal_one_prefill() -> None:
    """A windowed prompt prefilled in one call, then its last token attended as a decode step
    over the pool, gives that token's prefill row (to float32 rounding)."""
    window, total, block_size = 20, 50, 8
    pool = make_pool([total], 1, HEAD_DIM, block_size)
    keys = pool.k_cache[pool.block_tables[0].long()].reshape(-1, 1, HEAD_DIM)[:total]
    values = pool.v_cache[pool.block_tables[0].long()].reshape(-1, 1, HEAD_DIM)[:total]
    q = torch.randn(total, 3, HEAD_DIM)
    prefill = paged_prefill_attention_triton(
        q, keys, values, pool.k_cache, pool.v_cache, pool.block_tables,
        torch.tensor([0, total], dtype=torch.int32), torch.tensor([0], dtype=torch.int32),
        SCALE, None, None, window, block_m=16, block_n=16,
    )  # fmt: skip
    decode = paged_decode_attention_triton(
        q[-1:], pool.k_cache, pool.v_cache, pool.block_tables,
        torch.tensor([total], dtype=torch.int32), SCALE, None, None, window, block_n=16,
    )  # fmt: skip
    torch.testing.assert_close(decode, prefill[-1:], atol=2e-6, rtol=1e-5)


HYBRID_MODELS = {
    "gemma2": {"num_hidden_layers": 4, "sliding_window": 16, "query_pre_attn_scalar": 24,
               "tie_word_embeddings": True, "attn_logit_softcapping": 0.5,
               "final_logit_softcapping": 2.0},  # soft-capped scores on every layer
    "gemma3": {"num_hidden_layers": 6, "sliding_window": 16, "query_pre_attn_scalar": 24,
               "tie_word_embeddings": True},  # 5 sliding : 1 global
}  # fmt: skip


@pytest.mark.parametrize("architecture", sorted(HYBRID_MODELS))
def test_triton_hybrid_engine_matches_the_reference(
    tmp_path_factory: pytest.TempPathFactory, architecture: str
) -> None:
    """The whole engine on interpreted Triton kernels, windows and soft-caps in the kernels,
    with a hybrid KV cache smaller than one prompt's blocks (slots reused as windows slide):
    prompts several windows long, a prefix hit and decode give the plain reference engine's
    tokens, with no block or slot left held."""
    folder = make_tiny_model_dir(tmp_path_factory.mktemp(f"triton-{architecture}"),
                                 architecture, **HYBRID_MODELS[architecture])  # fmt: skip
    shared = [(7 * i) % 300 + 1 for i in range(45)]
    prompts = [[*shared, 11, 12, 13], shared + list(range(40, 80))]
    params = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
    with kernel_backend("reference"):
        plain = LLM(str(folder), dtype="float32", num_blocks=64, block_size=8,
                    hybrid_kv_cache=False, enable_prefix_caching=False)  # fmt: skip
        expected = [plain.generate([p], params)[0].token_ids for p in prompts]
    slots = SlidingSlots.min_slots(16, 8, 32)
    with kernel_backend("triton"):
        llm = LLM(str(folder), dtype="float32", block_size=8, max_num_batched_tokens=32,
                  hybrid_kv_cache=True, kv_sliding_slots=slots)  # fmt: skip
        got = [llm.generate([p], params)[0].token_ids for p in prompts]
    assert got == expected
    stats = llm.stats()
    assert stats["hit_tokens"] >= 40 and stats["sliding_slots"] < len(prompts[1]) // 8
    llm.cache.check_invariants()
    llm.engine.scheduler.check_invariants()
    assert stats["in_use"] == 0 and stats["running"] == 0 and stats["sliding_slots_held"] == 0
