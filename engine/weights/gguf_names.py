"""GGUF (llama.cpp) tensor names -> Hugging Face names, and undoing the Q/K row permutation.

llama.cpp's converter reorders the rows of Llama's q/k projections so that each head's
rotary pairs are interleaved (GPT-J style rope). HF (and this engine) use the rotate-half
layout, so those rows are permuted back on load.
"""

from __future__ import annotations

import re

import numpy as np

_GLOBAL_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
_BLOCK_NAMES = {
    "attn_norm.weight": "input_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_q.bias": "self_attn.q_proj.bias",
    "attn_k.bias": "self_attn.k_proj.bias",
    "attn_v.bias": "self_attn.v_proj.bias",
    "attn_output.weight": "self_attn.o_proj.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
}
# Gemma 2 / 3: the norms around the attention and MLP outputs, and q/k norms (Gemma 3)
_GEMMA_BLOCK_NAMES = {
    **_BLOCK_NAMES,
    "post_attention_norm.weight": "post_attention_layernorm.weight",
    "ffn_norm.weight": "pre_feedforward_layernorm.weight",
    "post_ffw_norm.weight": "post_feedforward_layernorm.weight",
    "attn_q_norm.weight": "self_attn.q_norm.weight",
    "attn_k_norm.weight": "self_attn.k_norm.weight",
}
_BLOCK_PATTERN = re.compile(r"blk\.(\d+)\.(.+)")

# Architectures whose q/k weights llama.cpp's converter permutes.
PERMUTED_ARCHITECTURES = ("llama",)
ROPE_FREQS_TENSOR = "rope_freqs.weight"


def hf_name_for_gguf_tensor(name: str, gemma: bool = False) -> str:
    """HF name for a GGUF tensor name (``gemma``: a Gemma file, where ``ffn_norm`` is the
    pre-MLP norm); ValueError for a name this engine does not know."""
    if name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[name]
    match = _BLOCK_PATTERN.fullmatch(name)
    names = _GEMMA_BLOCK_NAMES if gemma else _BLOCK_NAMES
    if match and match.group(2) in names:
        return f"model.layers.{match.group(1)}.{names[match.group(2)]}"
    raise ValueError(f"unsupported GGUF tensor {name!r}")


def unpermute_rotary_rows(weight: np.ndarray, num_heads: int) -> np.ndarray:
    """Inverse of llama.cpp's `permute(w, n_head)` on the rows of a q or k projection.

    `weight` `[num_heads * head_dim, in_features]`; for k pass the number of KV heads.
    Within each head llama.cpp stores rows as (pair, 2) interleaved; HF stores (2, pair).
    """
    rows = weight.shape[0]
    half = rows // num_heads // 2
    per_head = weight.reshape(num_heads, half, 2, *weight.shape[1:])
    return per_head.swapaxes(1, 2).reshape(weight.shape)
