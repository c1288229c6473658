"""The engine with a host-memory tier: a prefix the pool evicted is loaded back from the tier
and answers bitwise as the uncached engine does; salts stay apart; bad sizes are refused."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from step_logits import record_step_logits

from prefixcache.engine.llm import LLM
from prefixcache.engine.sampling_params import SamplingParams
from prefixcache.host_tier import TierCopy
from prefixcache.kernels.dispatch import cpu_kernels

GREEDY = SamplingParams(max_tokens=5, temperature=0.0, ignore_eos=True)
DOC = [(11 * i) % 290 + 3 for i in range(64)]  # a 64-token document
OTHERS = [[(13 * i + k) % 280 + 5 for i in range(64)] for k in range(1, 4)]  # push it out
QUESTIONS = [[7, 8, 9], [21, 22], [40, 41, 42, 43]]

DTYPES = [
    pytest.param("float32", id="f32"),
    pytest.param(
        "bfloat16", id="bf16",
        marks=pytest.mark.skipif(not cpu_kernels().cpu_attention_available(),
                                 reason="no bf16 CPU kernels here"),
    ),
]  # fmt: skip


def traffic(llm: LLM, salt: str | None = None) -> tuple[list[list[int]], list[torch.Tensor]]:
    """The document with a question, three other documents (the pool of 40 blocks of 4 tokens
    cannot keep them all), then the document with each question: tokens and step logits."""
    logits = record_step_logits(llm)
    prompts = [DOC + QUESTIONS[0], *OTHERS, *(DOC + q for q in QUESTIONS)]
    tokens = [llm.generate([p], GREEDY, salt=salt)[0].token_ids for p in prompts]
    return tokens, logits


@pytest.mark.parametrize("dtype", DTYPES)
def test_a_prefix_loaded_from_the_tier_answers_as_uncached(
    tiny_llama_hd64_dir: Path, dtype: str
) -> None:
    kwargs = dict(dtype=dtype, num_blocks=40, block_size=4)
    expected, expected_logits = traffic(LLM(str(tiny_llama_hd64_dir),
                                            enable_prefix_caching=False, **kwargs))  # fmt: skip
    tiered = LLM(str(tiny_llama_hd64_dir), kv_host_memory="4MiB", **kwargs)
    got, got_logits = traffic(tiered)
    assert got == expected
    assert all(torch.equal(a, b) for a, b in zip(got_logits, expected_logits, strict=True))
    stats = tiered.stats()
    assert stats["host_tier_hit_tokens"] >= 60  # the document's 15 full blocks, at least once
    assert stats["host_tier_blocks"] > 0 and tiered.host_tier.writebacks > 0
    assert tiered.host_tier.loads * 4 == stats["host_tier_hit_tokens"]
    tiered.cache.check_invariants()
    assert stats["in_use"] == 0

    plain = LLM(str(tiny_llama_hd64_dir), **kwargs)  # the same pool, no tier: fewer hits
    traffic(plain)
    assert plain.stats()["hit_tokens"] < stats["hit_tokens"]


def test_the_tier_keeps_salts_apart(tiny_llama_hd64_dir: Path) -> None:
    llm = LLM(str(tiny_llama_hd64_dir), dtype="float32", num_blocks=40, block_size=4,
              kv_host_memory=4 << 20)  # fmt: skip
    llm.generate([DOC + QUESTIONS[0]], GREEDY, salt="tenant-a")
    for other in OTHERS:
        llm.generate([other], GREEDY, salt="tenant-a")
    llm.generate([DOC + QUESTIONS[1]], GREEDY, salt="tenant-b")
    assert llm.stats()["host_tier_hit_tokens"] == 0
    llm.generate([DOC + QUESTIONS[1]], GREEDY, salt="tenant-a")
    assert llm.stats()["host_tier_hit_tokens"] > 0
    llm.cache.check_invariants()


@pytest.mark.parametrize("size, error", [
    ("lots", ValueError), (0, ValueError), (-1, ValueError), ("1B", ValueError),
    (1.5, TypeError), (True, TypeError),
])  # fmt: skip
def test_a_bad_host_memory_size_is_refused(tiny_llama_dir: Path, size, error) -> None:
    with pytest.raises(error, match="kv_host_memory"):
        LLM(str(tiny_llama_dir), dtype="float32", num_blocks=16, kv_host_memory=size)


def test_write_backs_land_before_loads_read(tiny_llama_dir: Path) -> None:
    """A step may write a block back into a slot and load that slot into another block: the
    load must read what the write-back put there."""
    llm = LLM(str(tiny_llama_dir), dtype="float32", num_blocks=8, block_size=4,
              kv_host_memory=1 << 20)  # fmt: skip
    tier, kv = llm.host_tier, llm.kv
    for layer in range(len(kv.k)):
        kv.k[layer][2].fill_(1.0)
        kv.v[layer][2].fill_(2.0)
        tier.k[layer][1].fill_(-1.0)
        tier.v[layer][1].fill_(-2.0)
    tier.apply([TierCopy(2, 1)], [TierCopy(3, 1)])
    for layer in range(len(kv.k)):
        assert bool((kv.k[layer][3] == 1.0).all()) and bool((kv.v[layer][3] == 2.0).all())
        assert bool((tier.k[layer][1] == 1.0).all())
