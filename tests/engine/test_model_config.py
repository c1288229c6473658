"""ModelConfig from HF config.json dicts and GGUF metadata, and its validation errors."""

from __future__ import annotations

import pytest

from prefixcache.engine.model_config import ModelConfig, RopeScaling

LLAMA_V4 = {  # transformers 4.x layout
    "model_type": "llama", "vocab_size": 49152, "hidden_size": 576, "intermediate_size": 1536,
    "num_hidden_layers": 30, "num_attention_heads": 9, "num_key_value_heads": 3,
    "rms_norm_eps": 1e-5, "rope_theta": 100000.0, "max_position_embeddings": 8192,
    "tie_word_embeddings": True, "bos_token_id": 1, "eos_token_id": 2,
    "rope_scaling": {"type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                     "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
}


def test_hf_v4_layout():
    config = ModelConfig.from_hf_config(LLAMA_V4)
    assert (config.num_layers, config.num_heads, config.num_kv_heads, config.head_dim) == (
        30, 9, 3, 64)
    assert config.rope_theta == 100000.0 and config.tie_word_embeddings
    assert config.rope_scaling == RopeScaling("llama3", 8.0, 1.0, 4.0, 8192)
    assert config.eos_token_ids == (2,) and config.bos_token_id == 1
    assert not config.attention_bias and config.q_size == 576 and config.kv_size == 192


def test_hf_v5_rope_parameters_layout():
    v5 = {k: v for k, v in LLAMA_V4.items() if k not in ("rope_theta", "rope_scaling")}
    v5["rope_parameters"] = {"rope_theta": 500000.0, "rope_type": "default"}
    v5["eos_token_id"] = [2, 7]
    config = ModelConfig.from_hf_config(v5)
    assert config.rope_theta == 500000.0 and config.rope_scaling.rope_type == "default"
    assert config.eos_token_ids == (2, 7)


def test_qwen2_always_has_qkv_bias():
    qwen = dict(LLAMA_V4, model_type="qwen2", rope_scaling=None)
    assert ModelConfig.from_hf_config(qwen).attention_bias


def test_gguf_metadata():
    metadata = {
        "general.architecture": "llama", "llama.block_count": 30, "llama.context_length": 8192,
        "llama.embedding_length": 576, "llama.feed_forward_length": 1536,
        "llama.attention.head_count": 9, "llama.attention.head_count_kv": 3,
        "llama.rope.freq_base": 100000.0, "llama.attention.layer_norm_rms_epsilon": 1e-5,
        "llama.vocab_size": 49152, "tokenizer.ggml.bos_token_id": 1,
        "tokenizer.ggml.eos_token_id": 2,
    }
    config = ModelConfig.from_gguf_metadata(metadata, has_output_tensor=False, has_qkv_bias=False)
    assert config == ModelConfig.from_hf_config(dict(LLAMA_V4, rope_scaling=None))


@pytest.mark.parametrize(("change", "message"), [
    ({"num_hidden_layers": None}, "num_hidden_layers"),
    ({"model_type": "gpt2"}, "unsupported architecture 'gpt2'"),
    ({"num_key_value_heads": 4}, "multiple of num_kv_heads"),
    ({"hidden_size": 577, "head_dim": None}, "not divisible"),
    ({"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, "unsupported rope scaling"),
    ({"rope_scaling": {"rope_type": "linear"}}, "needs a 'factor'"),
    ({"vocab_size": -1}, "vocab_size must be a positive integer"),
])
def test_invalid_hf_config_raises_clear_value_error(change, message):
    with pytest.raises(ValueError, match=message):
        ModelConfig.from_hf_config(dict(LLAMA_V4, **change))


def test_missing_model_type_and_non_object():
    with pytest.raises(ValueError, match="model_type"):
        ModelConfig.from_hf_config({"hidden_size": 8})
    with pytest.raises(ValueError, match="JSON object"):
        ModelConfig.from_hf_config([1, 2])  # type: ignore[arg-type]


def test_sliding_window_by_architecture():
    mistral = dict(LLAMA_V4, model_type="mistral", rope_scaling=None, sliding_window=4096)
    assert ModelConfig.from_hf_config(mistral).sliding_window == 4096
    qwen = dict(LLAMA_V4, model_type="qwen2", rope_scaling=None, sliding_window=4096)
    assert ModelConfig.from_hf_config(qwen).sliding_window is None  # use_sliding_window false
    with pytest.raises(ValueError, match="sliding window attention is not supported"):
        ModelConfig.from_hf_config(dict(qwen, use_sliding_window=True))
