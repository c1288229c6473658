"""Our HF-folder loader + decoder vs transformers on tiny random Llama / Mistral / Qwen2 models."""

from __future__ import annotations

import pytest
import torch
from model_layer_helpers import greedy_generate, hf_greedy_generate

from prefixcache.engine.model import ContiguousAttention
from prefixcache.engine.model_registry import load_model

FP32_ATOL = 1e-4
VARIANTS = {
    "llama-gqa-tied": ("llama", {}),
    "llama3-rope-untied": ("llama", {
        "tie_word_embeddings": False,
        "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                         "high_freq_factor": 4.0, "original_max_position_embeddings": 32},
        "rope_theta": 500000.0,
    }),
    "llama-mqa": ("llama", {"num_key_value_heads": 1}),
    "llama-mha-linear-rope": ("llama", {"num_key_value_heads": 4,
                                        "rope_scaling": {"rope_type": "linear", "factor": 2.0}}),
    "qwen2-bias": ("qwen2", {"num_key_value_heads": 2, "tie_word_embeddings": False}),
    "mistral": ("mistral", {"sliding_window": None}),
    "mistral-sliding-window": ("mistral", {"sliding_window": 5}),
}
PROMPT = [5, 17, 42, 99, 3, 250, 7, 8, 100, 101, 64, 12, 13, 200]


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_logits_and_greedy_match_transformers(make_hf_folder, variant):
    architecture, overrides = VARIANTS[variant]
    hf_model, folder = make_hf_folder(architecture, **overrides)
    loaded = load_model(folder, dtype=torch.float32)
    ids = torch.tensor(PROMPT)
    attention = ContiguousAttention(2, sliding_window=loaded.config.sliding_window)
    hidden = loaded.model(ids, torch.arange(len(PROMPT)), attention)
    ours = loaded.model.compute_logits(hidden)  # [T, vocab]
    with torch.inference_mode():
        reference = hf_model(ids[None]).logits[0].float()
    assert ours.dtype == torch.float32 and ours.shape == reference.shape
    torch.testing.assert_close(ours, reference, atol=FP32_ATOL, rtol=1e-4)
    assert greedy_generate(loaded.model, PROMPT, 16) == hf_greedy_generate(hf_model, PROMPT, 16)


def test_qwen2_bias_is_loaded(make_hf_folder):
    _, folder = make_hf_folder("qwen2")
    loaded = load_model(folder, dtype=torch.float32)
    assert loaded.config.attention_bias
    bias = loaded.model.layers[0].attn.qkv_proj.bias  # [q + 2 * kv]
    assert bias is not None and bias.abs().sum() > 0


def test_bfloat16_logits_close_to_transformers_bfloat16(make_hf_folder):
    hf_model, folder = make_hf_folder("llama")
    loaded = load_model(folder, dtype=torch.bfloat16)
    ids = torch.tensor(PROMPT)
    ours = loaded.model.compute_logits(
        loaded.model(ids, torch.arange(len(PROMPT)), ContiguousAttention(2)))
    with torch.inference_mode():
        reference = hf_model.to(torch.bfloat16)(ids[None]).logits[0].float()
    # bf16 has ~3 significant digits; logits here are O(10).
    assert loaded.model.dtype == torch.bfloat16
    torch.testing.assert_close(ours, reference, atol=0.15, rtol=0.02)
