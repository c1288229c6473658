"""Turn an HF-named state dict into a `CausalLM` with fused QKV and gate/up weights.

Both loaders (HF folder, GGUF) first produce tensors under Hugging Face names
(`model.layers.N.self_attn.q_proj.weight`, ...); this module is the only place that knows
the fused layout of `prefixcache.engine.model`.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import Tensor

from ..model.decoder import CausalLM
from ..model.mlp import fuse_rows
from ..model_config import ModelConfig

# Keys some checkpoints carry that the model recomputes.
_IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)


def fuse_hf_state_dict(config: ModelConfig, hf: Mapping[str, Tensor],
                       dtype: torch.dtype | None = None) -> dict[str, Tensor]:
    """Map HF names to this model's names, concatenating q/k/v and gate/up (fused tensors are
    created in `dtype`; others keep theirs).

    Raises ValueError naming any missing or unexpected tensor, or any shape mismatch.
    """
    remaining = {k: v for k, v in hf.items() if not k.endswith(_IGNORED_SUFFIXES)}

    def take(name: str) -> Tensor:
        if name not in remaining:
            raise ValueError(f"checkpoint is missing tensor {name!r}")
        return remaining.pop(name)

    def norm(name: str) -> Tensor:
        """A norm's weight; Gemma's ``(1 + w)`` with the 1 folded in, in float32."""
        weight = take(name)
        return weight.float() + 1.0 if config.is_gemma else weight

    fused: dict[str, Tensor] = {"embed_tokens.weight": take("model.embed_tokens.weight"),
                                "norm.weight": norm("model.norm.weight")}
    if config.tie_word_embeddings:
        remaining.pop("lm_head.weight", None)
    else:
        fused["lm_head.weight"] = take("lm_head.weight")
    for i in range(config.num_layers):
        src, dst = f"model.layers.{i}.", f"layers.{i}."
        attn = src + "self_attn."
        fused[dst + "input_norm.weight"] = norm(src + "input_layernorm.weight")
        fused[dst + "post_attention_norm.weight"] = norm(src + "post_attention_layernorm.weight")
        if config.sandwich_norms:
            for ours, theirs in (("pre_feedforward_norm", "pre_feedforward_layernorm"),
                                 ("post_feedforward_norm", "post_feedforward_layernorm")):
                fused[f"{dst}{ours}.weight"] = norm(f"{src}{theirs}.weight")
        if config.qk_norm:
            for head in "qk":
                fused[f"{dst}attn.{head}_norm.weight"] = norm(f"{attn}{head}_norm.weight")
        fused[dst + "attn.qkv_proj.weight"] = fuse_rows(
            *(take(f"{attn}{p}_proj.weight") for p in "qkv"), dtype=dtype)
        if config.attention_bias:
            fused[dst + "attn.qkv_proj.bias"] = fuse_rows(
                *(take(f"{attn}{p}_proj.bias") for p in "qkv"), dtype=dtype)
        fused[dst + "attn.o_proj.weight"] = take(attn + "o_proj.weight")
        fused[dst + "mlp.gate_up_proj.weight"] = fuse_rows(
            take(src + "mlp.gate_proj.weight"), take(src + "mlp.up_proj.weight"), dtype=dtype)
        fused[dst + "mlp.down_proj.weight"] = take(src + "mlp.down_proj.weight")
    if remaining:
        names = sorted(remaining)
        raise ValueError(f"checkpoint has {len(names)} unexpected tensor(s), e.g. {names[:5]}")
    return fused


def build_model(config: ModelConfig, hf: Mapping[str, Tensor], dtype: torch.dtype,
                device: torch.device | str = "cpu", pack: bool = True) -> CausalLM:
    """Create a `CausalLM` holding `hf`'s weights in `dtype` on `device`, in eval mode; with
    `pack` (on CPU) the projections are pre-packed for a GEMM kernel (`CausalLM.pack_weights`).

    The module is built on the meta device (no random init) and the fused tensors are
    assigned, so loading costs one copy per tensor.
    """
    fused = fuse_hf_state_dict(config, hf, dtype)
    with torch.device("meta"):
        model = CausalLM(config)
    expected = model.state_dict()
    for name, tensor in fused.items():
        want = expected[name].shape
        if tensor.shape != want:
            raise ValueError(
                f"tensor {name!r} has shape {tuple(tensor.shape)}, config implies {tuple(want)}"
            )
        fused[name] = tensor.to(device=device, dtype=dtype).contiguous()
    model.load_state_dict(fused, strict=True, assign=True)
    if pack:
        model.pack_weights()
    return model.eval()
