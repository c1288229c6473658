"""LLM constructor options: None means the default, anything else is checked before loading."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from prefixcache import PrefixCache
from prefixcache.engine.engine_options import resolve_dtype
from prefixcache.engine.kv_cache import kv_bytes_per_block
from prefixcache.engine.llm import LLM
from prefixcache.engine.sampling_params import SamplingParams
from prefixcache.engine.scheduler import Scheduler


@pytest.mark.parametrize(("kwargs", "error", "message"), [
    ({"max_num_seqs": 0}, ValueError, "max_num_seqs must be >= 1"),
    ({"max_num_seqs": -1}, ValueError, "max_num_seqs must be >= 1"),
    ({"max_num_seqs": 2.0}, TypeError, "max_num_seqs must be an int"),
    ({"max_num_batched_tokens": 0}, ValueError, "max_num_batched_tokens must be >= 1"),
    ({"max_num_batched_tokens": True}, TypeError, "max_num_batched_tokens must be an int"),
    ({"block_size": 0}, ValueError, "block_size must be >= 1"),
    ({"num_blocks": 0}, ValueError, "num_blocks must be >= 1"),
    ({"kv_cache_memory": 0}, ValueError, "kv_cache_memory must be >= 1"),
    ({"kv_cache_memory": -5}, ValueError, "kv_cache_memory must be >= 1"),
    ({"num_blocks": 64, "kv_cache_memory": 1 << 20}, ValueError, "give one of them"),
    ({"max_model_len": 0}, ValueError, "max_model_len must be >= 2"),
    ({"max_model_len": -5}, ValueError, "max_model_len must be >= 2"),
    ({"max_model_len": 1}, ValueError, "max_model_len must be >= 2"),
    ({"max_model_len": 2.5}, TypeError, "max_model_len must be an int"),
    ({"num_threads": 0}, ValueError, "num_threads must be >= 1"),
    ({"enable_prefix_caching": "no"}, TypeError, "enable_prefix_caching must be True or False"),
    ({"dtype": torch.int32}, ValueError, "dtype torch.int32 is not supported"),
    ({"dtype": torch.float64}, ValueError, r"not supported; choose from \[.*'float32'"),
    ({"dtype": "float64"}, ValueError, "unknown dtype 'float64'"),
    ({"dtype": 16}, TypeError, "dtype must be a torch.dtype or a str"),
])
def test_bad_options_fail_before_loading(tiny_llama_dir: Path, kwargs: dict, error: type,
                                         message: str) -> None:
    with pytest.raises(error, match=message):
        LLM(str(tiny_llama_dir), **kwargs)


def test_scheduler_checks_its_limits() -> None:
    cache = PrefixCache(num_blocks=8, block_size=4)
    with pytest.raises(ValueError, match="max_num_seqs must be >= 1"):
        Scheduler(cache, max_num_seqs=0, max_num_batched_tokens=16)
    with pytest.raises(ValueError, match="max_num_batched_tokens must be >= 1"):
        Scheduler(cache, max_num_seqs=4, max_num_batched_tokens=0)


def test_dtype_names_are_case_insensitive() -> None:
    assert resolve_dtype("BF16") is torch.bfloat16
    assert resolve_dtype(" Float32 ") is torch.float32
    assert resolve_dtype(torch.float16) is torch.float16 and resolve_dtype(None) is None


def test_small_explicit_values_are_used_not_replaced(tiny_llama_dir: Path) -> None:
    llm = LLM(str(tiny_llama_dir), dtype="FP32", num_blocks=8, block_size=4, max_model_len=2)
    assert llm.max_model_len == 2 and llm.dtype == torch.float32
    out = llm.generate([[5]], SamplingParams(max_tokens=4, temperature=0.0))[0]
    assert out.error is None and len(out.outputs[0].token_ids) == 1  # the context is full
    one_block = kv_bytes_per_block(llm.config, 4, torch.float32)
    sized = LLM(str(tiny_llama_dir), dtype="float32", block_size=4, kv_cache_memory=3 * one_block)
    assert sized.cache.num_blocks == 3
