"""The engine runs the kernels the choice names per row-count bucket: oneDNN and SDPA in the
buckets they were given (op by op, as the fused layers only hold the compiled kernels), the
compiled kernels and the fused layers elsewhere; answers stay the uncached path's greedy
tokens."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from kernel_calls import record_calls

from prefixcache import kernels
from prefixcache.engine.llm import LLM
from prefixcache.engine.model.packed_linear import PackedLinear
from prefixcache.engine.sampling_params import SamplingParams
from prefixcache.kernels.cpu.gemm_candidates import (
    ONEDNN,
    compiled_candidate,
    onednn_linear,
    onednn_pack,
    onednn_supports,
)
from prefixcache.kernels.cpu.kernel_choice import CHOICE_ENV, SDPA, KernelChoice
from prefixcache.kernels.dispatch import cpu_kernels
from prefixcache.kernels.reference.linear import unpack_linear_weight

GREEDY = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
SYSTEM = [(7 * i) % 300 + 1 for i in range(37)]
PROMPTS = [[*SYSTEM, 11, 12, 13], [*SYSTEM, *range(40, 61)], [*SYSTEM, 99], SYSTEM[:20]]


def runnable(dtype: torch.dtype) -> bool:
    weight = torch.zeros(64, 64, dtype=dtype)
    return compiled_candidate(weight) is not None and onednn_supports(dtype)


DTYPES = [
    pytest.param(d, id=str(d).removeprefix("torch."),
                 marks=pytest.mark.skipif(not runnable(d), reason=f"no {d} choice here"))
    for d in (torch.float32, torch.bfloat16)
]  # fmt: skip


def engine(folder: Path, dtype: torch.dtype, **kwargs) -> LLM:
    return LLM(str(folder), dtype=dtype, num_blocks=96, block_size=4, **kwargs)


def plain_weight(module: PackedLinear) -> torch.Tensor:  # [out, in]
    if module.compiled:
        return unpack_linear_weight(module.packed, module.out_features)
    return cpu_kernels().unpack_f32_weight(module.packed, module.out_features)


@pytest.mark.parametrize("dtype", DTYPES)
def test_a_projection_runs_onednn_in_its_buckets_only(dtype: torch.dtype) -> None:
    generator = torch.Generator().manual_seed(0)
    weight = torch.randn(192, 576, generator=generator).to(dtype)
    bias = torch.randn(192, generator=generator).to(dtype)
    module = PackedLinear(weight, bias)
    module.use_onednn_for(frozenset({16, 64, 256, 1024}))
    assert torch.equal(plain_weight(module), weight)
    differ = 0  # calls in which the two GEMMs' last bits differ: the check tells them apart
    for rows, expect_onednn in ((1, False), (15, False), (16, True), (70, True)):
        x = torch.randn(rows, 576, generator=generator).to(dtype)
        compiled = compiled_candidate(weight).run(x, module.packed, 192, module.bias)
        library = onednn_linear(x, onednn_pack(weight), 192, module.bias)
        assert torch.equal(module(x), library if expect_onednn else compiled), rows
        differ += not torch.equal(compiled, library)
    assert differ
    module.use_onednn_for(frozenset())
    assert module.onednn_packed is None and torch.equal(module(x), compiled)


@pytest.mark.parametrize("dtype", DTYPES)
def test_each_bucket_runs_the_gemm_it_was_given(
    tiny_llama_hd64_dir: Path, monkeypatch: pytest.MonkeyPatch, dtype: torch.dtype
) -> None:
    monkeypatch.setenv(CHOICE_ENV, "library>=16")
    llm = engine(tiny_llama_hd64_dir, dtype)
    model = llm.engine.runner.model
    assert model.kernel_choice is not None and model.kernel_choice.source == "env"
    for module in model.modules():
        if isinstance(module, PackedLinear):
            assert module.onednn_packed is not None
            head = module is model.lm_head
            assert module.onednn_buckets == ({16, 64} if head else {16, 64, 256, 1024})

    assert model.kernel_choice.chosen["attention"] == {64: SDPA, 256: SDPA, 1024: SDPA}
    layer_calls = record_calls(monkeypatch, cpu_kernels(), ["decoder_layers_cpu"])
    sdpa_calls = record_calls(monkeypatch, kernels, ["paged_prefill_attention_sdpa"])
    llm.generate([PROMPTS[1]], GREEDY)  # a 58-token prefill (op by op), then 5 decode steps
    assert len(layer_calls) == GREEDY.max_tokens - 1 and not sdpa_calls  # 58 < 64
    llm.generate([[*range(1, 80)]], GREEDY)  # 79 rows: SDPA in the first of the 2 layers
    assert len(sdpa_calls) == 1  # (the last attends for the sampled row only, as decode does)
    llm.cache.check_invariants()
    assert llm.stats()["in_use"] == 0


@pytest.mark.parametrize("dtype", DTYPES[:1])  # float32: the kernels differ in rounding only
def test_a_mixed_choice_answers_the_uncached_compiled_path(
    tiny_llama_hd64_dir: Path, monkeypatch: pytest.MonkeyPatch, dtype: torch.dtype
) -> None:
    """Prefix hits, chunked prefill (chunks of 24 rows: oneDNN; suffixes under 16: compiled;
    with chunks of 128, a 110-token prompt: SDPA too) and decode give the greedy tokens of the
    compiled kernels without any reuse. In float32, so that a random tiny model's near-tied
    logits cannot flip on another CPU's library rounding; bf16 steps run each bucket's kernel
    bit for bit (the tests above)."""
    prompts = [*PROMPTS, [*SYSTEM, *range(100, 173)], [*SYSTEM, *range(100, 150), 7]]
    monkeypatch.setenv(CHOICE_ENV, "compiled")
    plain = engine(tiny_llama_hd64_dir, dtype, enable_prefix_caching=False)
    expected = [plain.generate([p], GREEDY)[0].token_ids for p in prompts]
    monkeypatch.setenv(CHOICE_ENV, "library>=16")
    for chunk in (24, 128):
        mixed = engine(tiny_llama_hd64_dir, dtype, max_num_batched_tokens=chunk)
        got = [mixed.generate([p], GREEDY)[0].token_ids for p in prompts]
        assert got == expected, chunk
    assert mixed.stats()["hit_tokens"] > 0
    mixed.cache.check_invariants()
    assert mixed.stats()["in_use"] == 0


@pytest.mark.parametrize("dtype", DTYPES)
def test_a_choice_without_onednn_drops_its_copies(
    tiny_llama_hd64_dir: Path, monkeypatch: pytest.MonkeyPatch, dtype: torch.dtype
) -> None:
    monkeypatch.setenv(CHOICE_ENV, "library")
    model = engine(tiny_llama_hd64_dir, dtype).engine.runner.model
    projections = [m for m in model.modules() if isinstance(m, PackedLinear)]
    assert all(m.onednn_packed is not None for m in projections)
    model.apply_kernel_choice(KernelChoice({}))
    assert all(m.onednn_packed is None and not m.onednn_buckets for m in projections)
    assert model.kernel_choice.layers_fused(1000)
    assert ONEDNN not in repr(model)
