"""Sliding-window layers (Mistral: every layer; Qwen2: from `max_window_layers` on) in the
paged engine: greedy tokens and logits equal transformers past the window, a cached answer
equals an uncached one across chunk and block sizes, and the context is the model's own."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import transformers
from tiny_model_factory import make_tiny_model_dir

from prefixcache.engine.llm import LLM
from prefixcache.engine.model.contiguous_attention import ContiguousAttention
from prefixcache.engine.sampling_params import SamplingParams

GREEDY = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
WINDOWED = {
    "mistral": {"sliding_window": 16},
    "qwen2": {"sliding_window": 24, "use_sliding_window": True, "max_window_layers": 1,
              "num_hidden_layers": 3},
}  # fmt: skip


@pytest.fixture(scope="module", params=sorted(WINDOWED))
def windowed_dir(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    architecture = request.param
    return make_tiny_model_dir(tmp_path_factory.mktemp(f"sw-{architecture}"), architecture,
                               **WINDOWED[architecture])  # fmt: skip


def prompts() -> list[list[int]]:
    """Several windows long, sharing a 70-token prefix (not a block multiple), plus a repeat."""
    shared = [(7 * i) % 300 + 1 for i in range(70)]
    tails = [[11, 12, 13], list(range(40, 90)), [99]]
    return [shared + tail for tail in tails] + [shared + tails[0]]


def hf_greedy(folder: Path, prompt: list[int], count: int) -> list[int]:
    model = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    with torch.inference_mode():
        out = model.generate(torch.tensor([prompt]), max_new_tokens=count, do_sample=False,
                             min_new_tokens=count, pad_token_id=0)  # fmt: skip
    return out[0, len(prompt):].tolist()


def test_windows_are_read_per_layer(windowed_dir: Path) -> None:
    llm = LLM(str(windowed_dir), dtype="float32", num_blocks=128, block_size=4)
    windows = llm.config.layer_windows
    if llm.config.architecture == "mistral":
        assert windows == (16, 16)
    else:
        assert windows == (None, 24, 24)
    assert llm.max_model_len == 512  # the model's context, not the window


def test_greedy_and_logits_equal_transformers_past_the_window(windowed_dir: Path) -> None:
    llm = LLM(str(windowed_dir), dtype="float32", num_blocks=256, block_size=4)
    hf = transformers.AutoModelForCausalLM.from_pretrained(windowed_dir, dtype=torch.float32)
    prompt = prompts()[1]  # 120 tokens: several windows
    ids = torch.tensor(prompt)
    model = llm.engine.runner.model
    attention = ContiguousAttention(llm.config.num_layers, use_cache=False,
                                    sliding_window=llm.config.layer_windows)  # fmt: skip
    with torch.inference_mode():
        ours = model.compute_logits(model(ids, torch.arange(len(prompt)), attention))
        theirs = hf(ids[None]).logits[0]
    torch.testing.assert_close(ours, theirs, atol=1e-4, rtol=1e-4)
    assert llm.generate([prompt], GREEDY)[0].token_ids == hf_greedy(windowed_dir, prompt, 12)


@pytest.mark.parametrize("block_size", [4, 16])
@pytest.mark.parametrize("chunk", [5, 64])
def test_cached_equals_uncached_past_the_window(windowed_dir: Path, block_size: int,
                                                chunk: int) -> None:  # fmt: skip
    def run(**kwargs) -> tuple[list[list[int]], LLM]:
        llm = LLM(str(windowed_dir), dtype="float32", num_blocks=256, block_size=block_size,
                  **kwargs)  # fmt: skip
        return [llm.generate([p], GREEDY)[0].token_ids for p in prompts()], llm

    expected, _ = run(enable_prefix_caching=False)
    got, llm = run(max_num_batched_tokens=chunk)
    assert got == expected
    assert llm.stats()["hit_tokens"] >= 3 * (70 // block_size) * block_size
    batched = llm.generate(prompts(), GREEDY)  # mixed decode and chunked prefill
    assert [r.token_ids for r in batched] == expected
    llm.cache.check_invariants()
    assert llm.stats()["in_use"] == 0
