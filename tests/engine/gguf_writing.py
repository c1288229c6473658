"""Write tiny GGUF files the way llama.cpp's converter does (names, q/k permutation, metadata)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import gguf
import numpy as np
from model_layer_helpers import TINY_CHAT_TEMPLATE, train_tiny_tokenizer

_BLOCK = {
    "input_layernorm.weight": "attn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight", "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight", "self_attn.q_proj.bias": "attn_q.bias",
    "self_attn.k_proj.bias": "attn_k.bias", "self_attn.v_proj.bias": "attn_v.bias",
    "self_attn.o_proj.weight": "attn_output.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight", "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}
_GLOBAL = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight":
           "output_norm.weight", "lm_head.weight": "output.weight"}
_GEMMA_BLOCK = {  # llama.cpp's Gemma names: ffn_norm is the norm before the MLP there
    **_BLOCK,
    "post_attention_layernorm.weight": "post_attention_norm.weight",
    "pre_feedforward_layernorm.weight": "ffn_norm.weight",
    "post_feedforward_layernorm.weight": "post_ffw_norm.weight",
    "self_attn.q_norm.weight": "attn_q_norm.weight",
    "self_attn.k_norm.weight": "attn_k_norm.weight",
}


def llama_cpp_permute(weights: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp convert_hf_to_gguf.py `LlamaModel.permute` (rotate-half -> interleaved)."""
    return (weights.reshape(n_head, 2, weights.shape[0] // n_head // 2, *weights.shape[1:])
            .swapaxes(1, 2).reshape(weights.shape))


def gguf_name(hf_name: str, architecture: str = "llama") -> str:
    if hf_name in _GLOBAL:
        return _GLOBAL[hf_name]
    _, _, layer, rest = hf_name.split(".", 3)
    names = _GEMMA_BLOCK if architecture.startswith("gemma") else _BLOCK
    return f"blk.{layer}.{names[rest]}"


def gguf_tensors(hf_model: Any, architecture: str) -> dict[str, np.ndarray]:
    """GGUF-named float32 arrays; Llama q/k rows permuted as llama.cpp does."""
    config = hf_model.config
    out = {}
    for name, tensor in hf_model.state_dict().items():
        if name == "lm_head.weight" and config.tie_word_embeddings:
            continue
        array = tensor.detach().float().numpy().copy()
        if architecture == "llama" and name.endswith("q_proj.weight"):
            array = llama_cpp_permute(array, config.num_attention_heads)
        elif architecture == "llama" and name.endswith("k_proj.weight"):
            array = llama_cpp_permute(array, config.num_key_value_heads)
        if architecture.startswith("gemma") and name.endswith("norm.weight"):
            array = array + np.float32(1.0)  # llama.cpp stores Gemma's (1 + w)
        out[gguf_name(name, architecture)] = array
    return out


def write_tiny_gguf(hf_model: Any, path: Path, architecture: str = "llama",
                    qtype: gguf.GGMLQuantizationType = gguf.GGMLQuantizationType.F32,
                    sliding_window: int | None = None) -> Path:
    """Metadata (config, byte-level BPE vocabulary, chat template) and tensors in `qtype`
    (norms and biases stay F32, as llama.cpp keeps 1-D tensors); `sliding_window` writes
    `{arch}.attention.sliding_window`."""
    config = hf_model.config
    writer = gguf.GGUFWriter(str(path), architecture)
    writer.add_block_count(config.num_hidden_layers)
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(config.num_attention_heads)
    writer.add_head_count_kv(config.num_key_value_heads)
    rope = rope_parameters(config)
    writer.add_rope_freq_base(float(rope.get("full_attention", rope)["rope_theta"]))
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    writer.add_vocab_size(config.vocab_size)
    if sliding_window is not None:
        writer.add_sliding_window(sliding_window)
    if architecture.startswith("gemma"):
        writer.add_key_length(config.head_dim)
        writer.add_value_length(config.head_dim)
        for cap, add in ((config.attn_logit_softcapping, writer.add_attn_logit_softcapping),
                         (config.final_logit_softcapping, writer.add_final_logit_softcapping)):
            if cap is not None:
                add(float(cap))
    _add_tokenizer(writer, config.vocab_size)
    if rope_parameters(config).get("rope_type") == "llama3":
        writer.add_tensor("rope_freqs.weight", llama3_rope_factors(config))
    for name, array in gguf_tensors(hf_model, architecture).items():
        if array.ndim == 1 or qtype == gguf.GGMLQuantizationType.F32:
            writer.add_tensor(name, array)
        else:
            writer.add_tensor(name, gguf.quants.quantize(array, qtype), raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def rope_parameters(config: Any) -> dict[str, Any]:
    """RoPE settings in transformers 5 (`rope_parameters`) or 4.x (`rope_theta`, `rope_scaling`)."""
    params = getattr(config, "rope_parameters", None)
    if params:
        return dict(params)
    return {"rope_theta": config.rope_theta, **(config.rope_scaling or {})}


def llama3_rope_factors(config: Any) -> np.ndarray:
    """`rope_freqs.weight` as llama.cpp's converter computes it for Llama 3.1 scaling."""
    rope = rope_parameters(config)
    dim = config.hidden_size // config.num_attention_heads
    factor, low, high = rope["factor"], rope["low_freq_factor"], rope["high_freq_factor"]
    old_context = rope["original_max_position_embeddings"]
    factors = []
    for i in range(0, dim, 2):
        wavelen = 2 * math.pi * rope["rope_theta"] ** (i / dim)
        if wavelen < old_context / high:
            factors.append(1.0)
        elif wavelen > old_context / low:
            factors.append(factor)
        else:
            smooth = (old_context / wavelen - low) / (high - low)
            factors.append(1 / ((1 - smooth) / factor + smooth))
    return np.array(factors, dtype=np.float32)


def _add_tokenizer(writer: gguf.GGUFWriter, vocab_size: int) -> None:
    spec = json.loads(train_tiny_tokenizer().to_str())
    by_id = {index: token for token, index in spec["model"]["vocab"].items()}
    for added in spec["added_tokens"]:
        by_id[added["id"]] = added["content"]
    tokens = [by_id.get(i, f"<unused{i}>") for i in range(vocab_size)]
    merges = [m if isinstance(m, str) else " ".join(m) for m in spec["model"]["merges"]]
    special = {added["id"] for added in spec["added_tokens"] if added["special"]}
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_types([3 if i in special else 1 for i in range(vocab_size)])
    writer.add_token_merges(merges)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_chat_template(TINY_CHAT_TEMPLATE)
