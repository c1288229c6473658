"""Gemma 2 (alternating sliding and global layers, soft-capped scores and logits) and Gemma 3
text decoders (5 sliding : 1 global layers, q/k norms, two RoPE bases), both with GeGLU,
sandwich norms, scaled embeddings and query_pre_attn_scalar, equal transformers, and their
cached answers equal uncached ones."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import transformers
from tiny_model_factory import make_tiny_model_dir

from prefixcache.engine.llm import LLM
from prefixcache.engine.model.contiguous_attention import ContiguousAttention
from prefixcache.engine.sampling_params import SamplingParams

GREEDY = SamplingParams(max_tokens=10, temperature=0.0, ignore_eos=True)
GEMMA3 = {"num_hidden_layers": 6, "sliding_window": 16, "query_pre_attn_scalar": 24,
          "max_position_embeddings": 512, "tie_word_embeddings": True}  # fmt: skip
# small caps so that capping changes the scores and logits of these tiny random weights
GEMMA2 = {"num_hidden_layers": 4, "sliding_window": 16, "query_pre_attn_scalar": 24,
          "max_position_embeddings": 512, "tie_word_embeddings": True,
          "attn_logit_softcapping": 0.5, "final_logit_softcapping": 2.0}  # fmt: skip


def make_gemma_dir(folder: Path, architecture: str, overrides: dict) -> Path:
    folder = make_tiny_model_dir(folder, architecture, **overrides)
    model = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    with torch.no_grad():  # the (1 + w) norms start at w = 0: give them weights to fold
        for name, param in model.named_parameters():
            if name.endswith("norm.weight"):
                param.normal_(0.0, 0.3)
    model.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def gemma3_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_gemma_dir(tmp_path_factory.mktemp("gemma3"), "gemma3", GEMMA3)


@pytest.fixture(scope="module", params=["gemma2", "gemma3"])
def gemma_dir(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    overrides = GEMMA2 if request.param == "gemma2" else GEMMA3
    return make_gemma_dir(tmp_path_factory.mktemp(request.param), request.param, overrides)


def test_config_reads_gemma2(tmp_path: Path) -> None:
    llm = LLM(str(make_gemma_dir(tmp_path, "gemma2", GEMMA2)), dtype="float32", num_blocks=64,
              block_size=4)  # fmt: skip
    config = llm.config
    assert config.layer_windows == (16, None, 16, None)
    assert (config.attn_logit_softcap, config.final_logit_softcap) == (0.5, 2.0)
    assert (config.qk_norm, config.local_rope_theta, config.rope_theta) == (False, None, 10000.0)


def test_config_reads_gemma3(gemma3_dir: Path) -> None:
    llm = LLM(str(gemma3_dir), dtype="float32", num_blocks=64, block_size=4)
    config = llm.config
    assert config.layer_windows == (16,) * 5 + (None,)
    assert (config.qk_norm, config.sandwich_norms, config.mlp_activation) == (
        True, True, "gelu_tanh")
    assert config.softmax_scale == pytest.approx(24**-0.5)
    assert config.local_rope_theta == 10000.0 and config.rope_theta == 1_000_000.0
    assert llm.max_model_len == 512


def test_logits_and_greedy_equal_transformers(gemma_dir: Path) -> None:
    llm = LLM(str(gemma_dir), dtype="float32", num_blocks=256, block_size=4)
    hf = transformers.AutoModelForCausalLM.from_pretrained(gemma_dir, dtype=torch.float32,
                                                           attn_implementation="eager")
    prompt = [(5 * i) % 300 + 3 for i in range(90)]  # several windows
    ids = torch.tensor(prompt)
    model = llm.engine.runner.model
    config = llm.config
    attention = ContiguousAttention(config.num_layers, use_cache=False,
                                    sliding_window=config.layer_windows,
                                    scale=config.softmax_scale,
                                    softcap=config.attn_logit_softcap)  # fmt: skip
    with torch.inference_mode():
        ours = model.compute_logits(model(ids, torch.arange(len(prompt)), attention))
        theirs = hf(ids[None]).logits[0]
        expected = hf.generate(ids[None], max_new_tokens=10, min_new_tokens=10,
                               do_sample=False, pad_token_id=0)[0, len(prompt):].tolist()
    torch.testing.assert_close(ours, theirs, atol=1e-4, rtol=1e-4)
    assert llm.generate([prompt], GREEDY)[0].token_ids == expected


@pytest.mark.parametrize("chunk", [7, 64])
def test_cached_equals_uncached(gemma_dir: Path, chunk: int) -> None:
    shared = [(7 * i) % 300 + 1 for i in range(50)]
    prompts = [[*shared, 11, 12], shared + list(range(40, 80)), [*shared, 11, 12]]

    def run(**kwargs) -> tuple[list[list[int]], LLM]:
        llm = LLM(str(gemma_dir), dtype="float32", num_blocks=128, block_size=4, **kwargs)
        return [llm.generate([p], GREEDY)[0].token_ids for p in prompts], llm

    expected, _ = run(enable_prefix_caching=False)
    got, llm = run(max_num_batched_tokens=chunk)
    assert got == expected
    assert llm.stats()["hit_tokens"] >= 2 * 48
    llm.cache.check_invariants()
