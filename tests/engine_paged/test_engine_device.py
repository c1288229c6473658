"""``LLM(device=...)``: weights, KV pool and step tensors on one device, bad names rejected.

The CUDA cases run only where a GPU is visible; on CPU-only machines the same engine path
(Triton kernels included) is covered by the interpreted-Triton engine test in tests/kernels.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from prefixcache.engine import LLM, SamplingParams
from prefixcache.engine.attention_metadata import AttentionMetadata
from prefixcache.engine.devices import resolve_device

GREEDY = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
SHARED = [(5 * i) % 250 + 3 for i in range(40)]
PROMPTS = [[*SHARED, 7, 8, 9], [*SHARED, 10, 11], [*SHARED[:20], 12]]
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device visible")


def one_by_one(llm: LLM, params: SamplingParams = GREEDY) -> list[list[int]]:
    return [llm.generate([p], params)[0].token_ids for p in PROMPTS]


def test_default_device_is_cpu_and_explicit_cpu_matches(tiny_llama_dir: Path) -> None:
    default = LLM(str(tiny_llama_dir), dtype="float32", num_blocks=32)
    explicit = LLM(str(tiny_llama_dir), dtype="float32", num_blocks=32, device="cpu")
    assert default.device == explicit.device == torch.device("cpu")
    assert explicit.kv.k[0].device.type == "cpu" and explicit.engine.runner.device.type == "cpu"
    assert one_by_one(default) == one_by_one(explicit)


@pytest.mark.parametrize(
    ("device", "error", "message"),
    [
        ("tpu", ValueError, "unknown device 'tpu'"),
        ("meta", ValueError, "not supported"),
        (3, TypeError, "device must be a str"),
    ],
)
def test_bad_device_names_fail_before_loading(device: object, error: type, message: str) -> None:
    with pytest.raises(error, match=message):
        resolve_device(device)  # type: ignore[arg-type]


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU message")
def test_cuda_without_a_gpu_says_so(tiny_llama_dir: Path) -> None:
    with pytest.raises(ValueError, match="no CUDA device"):
        LLM(str(tiny_llama_dir), device="cuda")


def test_metadata_moves_every_tensor() -> None:
    def index(*values: int) -> torch.Tensor:
        return torch.tensor(values, dtype=torch.int32)

    meta = AttentionMetadata(
        index(1, 2), index(0, 1), index(4, 5), 1, index(0)[None], index(1), index(0)[None],
        index(0, 1), index(0), index(1), index(0)[None], index(2),
    )
    assert meta.to(torch.device("cpu")) is meta
    moved = meta.to(torch.device("meta"))
    tensors = [v for v in vars(moved).values() if isinstance(v, torch.Tensor)]
    assert len(tensors) == 11 and all(t.device.type == "meta" for t in tensors)
    assert moved.num_decode_tokens == 1


@needs_cuda
@pytest.mark.parametrize("kv_cache_dtype", ["auto", "int8"])
def test_cuda_engine_matches_cpu_engine(tiny_llama_dir: Path, kv_cache_dtype: str) -> None:
    """Triton kernels on the GPU: prefix hits, decode and n=2 forks give the CPU's tokens."""
    params = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True, n=2)
    kwargs = dict(dtype="float32", num_blocks=32, kv_cache_dtype=kv_cache_dtype)
    expected = one_by_one(LLM(str(tiny_llama_dir), **kwargs), params)
    gpu = LLM(str(tiny_llama_dir), device="cuda", **kwargs)
    assert gpu.kv.k[0].is_cuda and gpu.engine.runner.device.type == "cuda"
    assert one_by_one(gpu, params) == expected
    assert gpu.stats()["hit_tokens"] >= 32
    gpu.cache.check_invariants()
    assert gpu.stats()["in_use"] == 0
