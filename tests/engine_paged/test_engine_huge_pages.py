"""The model's packed weights and its greedy screen in huge-page-advised memory: placed there
when the machine offers huge pages, and computing exactly what ordinary memory computes."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from memory_mappings import vm_flags_of

from prefixcache.engine import LLM, SamplingParams
from prefixcache.kernels.cpu import huge_pages_available
from prefixcache.kernels.dispatch import cpu_kernels

needs_huge_pages = pytest.mark.skipif(
    not huge_pages_available(), reason="no transparent huge pages on this machine"
)
# the arena holds the compiled bf16 GEMM's packed weights; without that GEMM nothing goes there
needs_compiled_gemm = pytest.mark.skipif(
    not cpu_kernels().cpu_linear_supports(torch.zeros(2, 2, dtype=torch.bfloat16)),
    reason="the compiled bf16 GEMM is unavailable on this machine",
)


@needs_huge_pages
@needs_compiled_gemm
def test_weights_in_huge_pages_give_the_same_tokens(
    tiny_llama_hd64_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    params = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
    prompts = [[5, 6, 7, 8, 9] * 3, [11, 12, 13]]
    llm = LLM(str(tiny_llama_hd64_dir), dtype="bfloat16", num_blocks=64, block_size=4)
    model = llm.engine.runner.model
    packed = model.layers[0].mlp.gate_up_proj.packed
    flags = vm_flags_of(packed.data_ptr())
    assert "hg" in flags, f"packed weight at {packed.data_ptr():#x}: {sorted(flags)}"
    if model.greedy_screen is not None:
        flags = vm_flags_of(model.greedy_screen.q.data_ptr())
        assert "hg" in flags, f"greedy screen: {sorted(flags)}"
    placed = [out.outputs[0].token_ids for out in llm.generate(prompts, params)]
    monkeypatch.setenv("PREFIXCACHE_HUGE_PAGES", "0")
    plain_llm = LLM(str(tiny_llama_hd64_dir), dtype="bfloat16", num_blocks=64, block_size=4)
    plain = plain_llm.engine.runner.model.layers[0].mlp.gate_up_proj.packed
    flags = vm_flags_of(plain.data_ptr())
    assert "hg" not in flags, f"plain weight at {plain.data_ptr():#x}: {sorted(flags)}"
    assert torch.equal(plain, packed), "the two packings differ"
    got = [out.outputs[0].token_ids for out in plain_llm.generate(prompts, params)]
    assert got == placed, f"ordinary pages {got}, huge pages {placed}"
