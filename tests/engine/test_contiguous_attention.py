"""ContiguousAttention: incremental decode and chunked prefill equal one full causal pass."""

from __future__ import annotations

import pytest
import torch
from model_layer_helpers import save_hf_folder, tiny_hf_model

from prefixcache.engine.model import ContiguousAttention, causal_attention
from prefixcache.engine.model_registry import load_model


def reference_attention(q, k, v, window=None):
    """Explicit softmax attention, bottom-right causal. q [H,T,D], k/v [KV,S,D] -> [H,T,D]."""
    groups = q.shape[0] // k.shape[0]
    k = k.repeat_interleave(groups, dim=0)  # [H, S, D]
    v = v.repeat_interleave(groups, dim=0)
    num_new, num_total = q.shape[1], k.shape[1]
    scores = q @ k.transpose(1, 2) / q.shape[-1] ** 0.5  # [H, T, S]
    allowed = torch.ones(num_new, num_total, dtype=torch.bool).tril(num_total - num_new)
    if window is not None:
        allowed &= ~torch.ones_like(allowed).tril(num_total - num_new - window)
    scores = scores.masked_fill(~allowed, float("-inf"))
    return scores.softmax(-1) @ v


@pytest.mark.parametrize(("heads", "kv_heads", "new", "total", "window"), [
    (4, 2, 5, 5, None), (4, 1, 3, 9, None), (4, 4, 1, 7, None), (6, 2, 6, 6, None),
    (6, 3, 4, 10, None), (4, 2, 6, 6, 3), (4, 1, 4, 10, 4), (4, 2, 1, 9, 2), (4, 2, 5, 5, 9),
])
def test_causal_attention_matches_explicit_softmax(heads, kv_heads, new, total, window):
    generator = torch.Generator().manual_seed(0)
    q = torch.randn(heads, new, 8, generator=generator)
    k = torch.randn(kv_heads, total, 8, generator=generator)
    v = torch.randn(kv_heads, total, 8, generator=generator)
    torch.testing.assert_close(causal_attention(q, k, v, window),
                               reference_attention(q, k, v, window), atol=1e-5, rtol=1e-5)


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    folder = save_hf_folder(tiny_hf_model("llama", max_position_embeddings=64),
                            tmp_path_factory.mktemp("tiny"))
    return load_model(folder, dtype=torch.float32).model


def full_logits(model, ids):
    hidden = model(ids, torch.arange(ids.numel()), ContiguousAttention(2, use_cache=False))
    return model.compute_logits(hidden)  # [T, vocab]


def test_chunked_prefill_and_decode_equal_full_pass(tiny_model):
    ids = torch.randint(3, 300, (23,), generator=torch.Generator().manual_seed(1))
    expected = full_logits(tiny_model, ids)
    attention = ContiguousAttention(2)
    pieces, start = [], 0
    for size in (7, 5, 1, 1, 9):  # prefill chunks with history, then single decode steps
        chunk = slice(start, start + size)
        hidden = tiny_model(ids[chunk], torch.arange(start, start + size), attention)
        pieces.append(tiny_model.compute_logits(hidden))
        start += size
    assert attention.num_cached_tokens == 23
    torch.testing.assert_close(torch.cat(pieces), expected, atol=1e-4, rtol=1e-4)


def test_reset_starts_a_new_sequence(tiny_model):
    ids = torch.tensor([5, 6, 7, 8])
    attention = ContiguousAttention(2)
    tiny_model(torch.tensor([40, 41]), torch.arange(2), attention)
    attention.reset()
    assert attention.num_cached_tokens == 0
    hidden = tiny_model(ids, torch.arange(4), attention)
    torch.testing.assert_close(tiny_model.compute_logits(hidden), full_logits(tiny_model, ids))


def test_positions_beyond_initial_rope_table_extend_it(tiny_model):
    ids = torch.tensor([11, 12, 13])
    far = torch.tensor([100, 101, 102])  # config max_position_embeddings is 64
    hidden = tiny_model(ids, far, ContiguousAttention(2, use_cache=False))
    assert torch.isfinite(hidden).all()


def test_forward_rejects_batched_input(tiny_model):
    with pytest.raises(ValueError, match="1-D"):
        tiny_model(torch.zeros(1, 3, dtype=torch.int64), torch.zeros(1, 3, dtype=torch.int64),
                   ContiguousAttention(2))


@pytest.mark.parametrize("rows", [[22], [0, 5, 22], [], [3, 4]])
def test_output_rows_equal_those_rows_of_the_full_pass(tiny_model, rows):
    """The last layer computes only `output_rows`; after a cached first chunk too."""
    ids = torch.randint(3, 300, (30,), generator=torch.Generator().manual_seed(2))
    expected = full_logits(tiny_model, ids)[7:]  # [23, vocab] rows 7.. of the full pass
    attention = ContiguousAttention(2)
    tiny_model(ids[:7], torch.arange(7), attention)  # cached history
    selected = torch.tensor(rows, dtype=torch.int64)
    hidden = tiny_model(ids[7:], torch.arange(7, 30), attention, output_rows=selected)
    assert hidden.shape == (len(rows), tiny_model.config.hidden_size)
    assert attention.num_cached_tokens == 30  # every token's k/v was still cached
    torch.testing.assert_close(tiny_model.compute_logits(hidden), expected[selected],
                               atol=1e-4, rtol=1e-4)
