"""Hugging Face transformers on the same weights as the engine: the reference to beat."""

from __future__ import annotations

import torch

from prefixcache.engine.model_config import ModelConfig
from prefixcache.engine.model_registry import resolve_model
from prefixcache.engine.weights.gguf_file import GGUFFile


def hf_llama_from(model: str, dtype: torch.dtype) -> torch.nn.Module:
    """A transformers ``LlamaForCausalLM`` holding exactly the weights our loader reads."""
    import transformers

    resolved = resolve_model(model)
    if resolved.kind == "gguf":
        source = GGUFFile(resolved.path)
        config, state = source.config, source.hf_state_dict()
    else:
        return transformers.AutoModelForCausalLM.from_pretrained(resolved.path, dtype=dtype)
    return hf_llama_from_state(config, state, dtype)


def hf_llama_from_state(
    config: ModelConfig, state: dict[str, torch.Tensor], dtype: torch.dtype
) -> torch.nn.Module:
    """A transformers ``LlamaForCausalLM`` holding ``state`` (HF tensor names)."""
    import transformers

    hf = transformers.LlamaForCausalLM(_llama_config(config))
    missing, unexpected = hf.load_state_dict(state, strict=False)
    if unexpected or [m for m in missing if "rotary" not in m and m != "lm_head.weight"]:
        raise RuntimeError(f"weights do not fit: missing {missing}, unexpected {unexpected}")
    if config.tie_word_embeddings:
        hf.tie_weights()
    return hf.to(dtype).eval()


def _llama_config(config: ModelConfig):
    import transformers

    return transformers.LlamaConfig(
        vocab_size=config.vocab_size,
        hidden_size=config.hidden_size,
        intermediate_size=config.intermediate_size,
        num_hidden_layers=config.num_layers,
        num_attention_heads=config.num_heads,
        num_key_value_heads=config.num_kv_heads,
        head_dim=config.head_dim,
        rms_norm_eps=config.rms_norm_eps,
        rope_theta=config.rope_theta,
        max_position_embeddings=config.max_position_embeddings,
        tie_word_embeddings=config.tie_word_embeddings,
    )


@torch.inference_mode()
def hf_last_logits(model: torch.nn.Module, token_ids: list[int]) -> torch.Tensor:  # [vocab]
    """One forward over ``token_ids``, computing logits for the last position only (on the
    model's device; returned on the CPU, so the time includes the device's work)."""
    ids = torch.tensor([token_ids], device=model.device)
    return model(ids, logits_to_keep=1).logits[0, -1].cpu()
