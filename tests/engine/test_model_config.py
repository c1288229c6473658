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
    sliding = ModelConfig.from_hf_config(dict(qwen, use_sliding_window=True, max_window_layers=1))
    assert sliding.layer_windows == (None,) + (4096,) * (sliding.num_layers - 1)
    none_slide = dict(qwen, use_sliding_window=True, max_window_layers=sliding.num_layers)
    assert ModelConfig.from_hf_config(none_slide).layer_windows == (None,) * sliding.num_layers
    assert ModelConfig.from_hf_config(mistral).layer_windows == (4096,) * sliding.num_layers


def test_layer_types_name_each_layers_attention():
    layers = LLAMA_V4["num_hidden_layers"]
    types = ["sliding_attention", "full_attention"] * (layers // 2) + ["full_attention"] * (
        layers % 2)
    config = ModelConfig.from_hf_config(dict(LLAMA_V4, layer_types=types, sliding_window=64))
    assert config.layer_windows == tuple(64 if t == "sliding_attention" else None for t in types)
    with pytest.raises(ValueError, match="no sliding_window"):
        ModelConfig.from_hf_config(dict(LLAMA_V4, layer_types=types))
    with pytest.raises(ValueError, match="layer_types must list"):
        ModelConfig.from_hf_config(dict(LLAMA_V4, layer_types=types[:-1], sliding_window=64))
    full = ModelConfig.from_hf_config(dict(LLAMA_V4, layer_types=["full_attention"] * layers,
                                           sliding_window=64))  # fmt: skip
    assert full.sliding_window is None and full.layer_windows == (None,) * layers


@pytest.mark.parametrize(("change", "message"), [
    ({"hidden_size": "64"}, "hidden_size must be a positive integer, got '64'"),
    ({"num_attention_heads": "4"}, "num_attention_heads must be a positive integer, got '4'"),
    ({"num_key_value_heads": 0}, "num_key_value_heads must be a positive integer, got 0"),
    ({"head_dim": 0}, "head_dim must be a positive integer, got 0"),
    ({"head_dim": "64"}, "head_dim must be a positive integer"),
    ({"max_position_embeddings": 512.0}, "max_position_embeddings must be a positive integer"),
    ({"rms_norm_eps": "abc"}, "rms_norm_eps must be a finite number, got 'abc'"),
    ({"rope_theta": "x"}, "rope_theta must be a finite number"),
    ({"rope_parameters": [1]}, "rope_parameters must be an object"),
    ({"rope_scaling": {"rope_type": "linear", "factor": "2"}}, "factor must be a finite number"),
    ({"eos_token_id": "abc"}, "eos_token_id must be a token id"),
    ({"eos_token_id": {}}, "eos_token_id must be a token id"),
    ({"eos_token_id": [2, "x"]}, "eos_token_id must be a token id"),
    ({"bos_token_id": "1"}, "bos_token_id must be a token id"),
    ({"tie_word_embeddings": "false"}, "tie_word_embeddings must be true or false"),
    ({"hidden_act": "gelu"}, "hidden_act is 'gelu'; only \\['silu', 'swish'\\]"),
    ({"model_type": "mistral", "sliding_window": "abc"}, "sliding_window must be a positive"),
    ({"model_type": "mistral", "sliding_window": 0}, "sliding_window must be a positive"),
])
def test_hf_config_values_are_type_checked_naming_the_key(change, message):
    with pytest.raises(ValueError, match=f"config.json.*{message}"):
        ModelConfig.from_hf_config(dict(LLAMA_V4, **change))


def test_silu_and_swish_are_the_same_activation():
    for act in ("silu", "swish"):
        assert ModelConfig.from_hf_config(dict(LLAMA_V4, hidden_act=act)).num_layers == 30


GGUF_METADATA = {
    "general.architecture": "llama", "llama.block_count": 2, "llama.embedding_length": 64,
    "llama.feed_forward_length": 96, "llama.attention.head_count": 4, "llama.vocab_size": 320,
}


@pytest.mark.parametrize(("change", "message"), [
    ({"llama.context_length": "abc"}, "llama.context_length must be a positive integer"),
    ({"llama.attention.head_count_kv": 0}, "llama.attention.head_count_kv must be a positive"),
    ({"llama.rope.scaling.type": "linear"}, "missing required key 'llama.rope.scaling.factor'"),
    ({"llama.attention.layer_norm_rms_epsilon": "x"}, "layer_norm_rms_epsilon must be a finite"),
    ({"tokenizer.ggml.eos_token_id": "2"}, "tokenizer.ggml.eos_token_id must be a token id"),
    ({"llama.attention.sliding_window": "4"}, "llama.attention.sliding_window must be a positive"),
    ({"llama.attention.sliding_window": 0}, "llama.attention.sliding_window must be a positive"),
])
def test_gguf_metadata_values_are_type_checked_naming_the_key(change, message):
    with pytest.raises(ValueError, match=message):
        ModelConfig.from_gguf_metadata(dict(GGUF_METADATA, **change), has_output_tensor=False,
                                       has_qkv_bias=False)


def test_gguf_linear_rope_scaling():
    metadata = dict(GGUF_METADATA, **{"llama.rope.scaling.type": "linear",
                                      "llama.rope.scaling.factor": 2.0})
    config = ModelConfig.from_gguf_metadata(metadata, has_output_tensor=False, has_qkv_bias=False)
    assert config.rope_scaling == RopeScaling("linear", 2.0)


def _gguf_config(metadata: dict) -> ModelConfig:
    return ModelConfig.from_gguf_metadata(metadata, has_output_tensor=False, has_qkv_bias=False)


def test_gguf_sliding_window_by_architecture():
    """`{arch}.attention.sliding_window` is honoured like HF `sliding_window` (Qwen2: ignored)."""
    mistral = {k.replace("llama.", "mistral."): v for k, v in GGUF_METADATA.items()}
    mistral.update({"general.architecture": "mistral", "mistral.attention.sliding_window": 4})
    assert _gguf_config(mistral).sliding_window == 4
    llama = dict(GGUF_METADATA, **{"llama.attention.sliding_window": 8})
    assert _gguf_config(llama).sliding_window == 8
    assert _gguf_config(GGUF_METADATA).sliding_window is None
    qwen = {k.replace("llama.", "qwen2."): v for k, v in GGUF_METADATA.items()}
    qwen.update({"general.architecture": "qwen2", "qwen2.attention.sliding_window": 4})
    assert _gguf_config(qwen).sliding_window is None
