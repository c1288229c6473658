"""Quantized tiers (``kv_tier_dtype``): blocks leave the pool as fp8/int8 and come back as
exactly the codec's round trip of what left; the tiers hold twice the blocks in the same bytes;
a store of one tier dtype is never read by an engine of another."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from prefixcache.engine.llm import LLM
from prefixcache.engine.sampling_params import SamplingParams

GREEDY = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)
DOC = [(13 * i) % 290 + 3 for i in range(32)]
FILLER = [[(7 * i + 31 * k) % 290 + 3 for i in range(64)] for k in range(3)]


def engine(folder: Path, **kwargs: Any) -> LLM:
    return LLM(str(folder), dtype="bfloat16", num_blocks=24, block_size=4, **kwargs)


def prefix_blocks(llm: LLM) -> list[torch.Tensor]:
    """Every pool's rows of DOC's cached blocks (K pools, then V pools)."""
    ids = torch.tensor(llm.cache.match(DOC, count=False).block_ids, dtype=torch.int64)
    llm.cache.release(ids.tolist())
    assert len(ids) == len(DOC) // 4
    return [pool.index_select(0, ids).clone() for pool in [*llm.kv.k, *llm.kv.v]]


def push_out(llm: LLM) -> None:
    for filler in FILLER:
        llm.generate([filler], GREEDY)
    assert llm.cache.lookup(DOC) == 0


@pytest.mark.parametrize("tier_dtype", ["fp8", "int8"])
def test_a_block_comes_back_as_the_codecs_round_trip(tiny_llama_dir: Path, tier_dtype: str,
                                                     tmp_path: Path) -> None:  # fmt: skip
    for tiers in ({"kv_host_memory": "1MiB"}, {"kv_disk_dir": tmp_path / tier_dtype}):
        llm = engine(tiny_llama_dir, kv_tier_dtype=tier_dtype, **tiers)
        codec = llm.tiers.codec
        assert codec is not None and codec.dtype != llm.kv.dtype
        llm.generate([DOC], GREEDY)
        left = prefix_blocks(llm)
        llm.flush_tiers()
        push_out(llm)
        llm.flush_tiers()
        out = llm.generate([[*DOC, 5, 6]], GREEDY)[0]
        assert out.num_cached_tokens == len(DOC)
        back = prefix_blocks(llm)
        for i, (before, after) in enumerate(zip(left, back, strict=True)):
            assert torch.equal(after, codec.decode(i, codec.encode(i, before)))
            assert not torch.equal(after, before)  # the round trip is lossy: it did happen
        llm.cache.check_invariants()


def test_a_quantized_tier_holds_twice_the_blocks(tiny_llama_dir: Path, tmp_path: Path) -> None:
    plain = engine(tiny_llama_dir, kv_host_memory="1MiB", kv_disk_dir=tmp_path / "a")
    fp8 = engine(tiny_llama_dir, kv_host_memory="1MiB", kv_disk_dir=tmp_path / "b",
                 kv_tier_dtype="fp8")  # fmt: skip
    assert fp8.cache.host_tier.num_slots == 2 * plain.cache.host_tier.num_slots
    assert fp8.host_tier.nbytes <= plain.host_tier.nbytes
    assert fp8.disk_tier.store.record_bytes * 2 == plain.disk_tier.store.record_bytes
    assert fp8.kv.nbytes == plain.kv.nbytes  # the pool itself is not quantized


def test_a_store_of_another_tier_dtype_is_never_read(tiny_llama_dir: Path,
                                                     tmp_path: Path) -> None:  # fmt: skip
    disk = tmp_path / "kv"
    writer = engine(tiny_llama_dir, kv_disk_dir=disk, kv_tier_dtype="fp8")
    writer.generate([DOC], GREEDY)
    writer.flush_tiers()
    assert writer.stats()["disk_tier_records"] >= len(DOC) // 4
    for tier_dtype in ("auto", "int8"):
        reader = engine(tiny_llama_dir, kv_disk_dir=disk, kv_tier_dtype=tier_dtype)
        assert reader.stats()["disk_tier_records"] == 0
        assert reader.generate([[*DOC, 5]], GREEDY)[0].num_cached_tokens == 0
    again = engine(tiny_llama_dir, kv_disk_dir=disk, kv_tier_dtype="fp8")  # same scales
    assert again.generate([[*DOC, 5]], GREEDY)[0].num_cached_tokens == len(DOC)


@pytest.mark.parametrize(("options", "error", "match"), [
    ({"kv_tier_dtype": "fp16"}, ValueError, "unknown kv_tier_dtype"),
    ({"kv_tier_dtype": 8}, TypeError, "kv_tier_dtype"),
    ({"kv_tier_dtype": "int8", "kv_cache_dtype": "fp8"}, ValueError, "float KV pool"),
])  # fmt: skip
def test_a_bad_tier_dtype_is_refused(tiny_llama_dir: Path, options: dict, error: type,
                                     match: str) -> None:  # fmt: skip
    with pytest.raises(error, match=match):
        engine(tiny_llama_dir, kv_host_memory="1MiB", **options)
