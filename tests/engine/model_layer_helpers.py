"""Helpers for the model-layer tests: tiny random HF models saved in process, greedy decoding."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from prefixcache.engine.model import CausalLM, ContiguousAttention

CORPUS = [
    "The quick brown fox jumps over the lazy dog. Paris is the capital of France.",
    "Prefix caching keeps the attention keys and values of repeated prompts.",
    "def add(a, b):\n    return a + b  # numbers 12345 and ünïcödé 日本語 😀",
] * 10
TINY_CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def train_tiny_tokenizer(vocab_size: int = 300) -> Tokenizer:
    """Byte-level BPE with specials `<|endoftext|>` (0), `<|im_start|>` (1), `<|im_end|>` (2)."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, show_progress=False,
        special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tokenizer.train_from_iterator(CORPUS, trainer)
    return tokenizer


def tiny_hf_model(architecture: str = "llama", seed: int = 0, **overrides: Any) -> Any:
    """A random 2-layer transformers model (GQA 4/2 by default), weights scaled up so greedy
    decoding has clear winners."""
    import transformers

    settings: dict[str, Any] = dict(
        vocab_size=320, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
        rms_norm_eps=1e-5, bos_token_id=None, eos_token_id=2, tie_word_embeddings=True,
    )
    settings.update(overrides)
    classes = {
        "llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM),
        "qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM),
        "mistral": (transformers.MistralConfig, transformers.MistralForCausalLM),
        "gemma2": (transformers.Gemma2Config, transformers.Gemma2ForCausalLM),
        "gemma3": (transformers.Gemma3TextConfig, transformers.Gemma3ForCausalLM),
    }
    if architecture.startswith("gemma"):  # head_dim and its scalar as llama.cpp assumes them
        head_dim = settings["hidden_size"] // settings["num_attention_heads"]
        settings = {"head_dim": head_dim, "query_pre_attn_scalar": head_dim, **settings}
    config_class, model_class = classes[architecture]
    torch.manual_seed(seed)
    model = model_class(config_class(**settings)).eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" in name:
                param.uniform_(0.5, 1.5)
            else:
                param.normal_(0.0, 0.1)
    return model


def save_hf_folder(model: Any, folder: Path,
                   chat_template: str | None = TINY_CHAT_TEMPLATE) -> Path:
    """`save_pretrained` (safetensors) plus tokenizer.json and tokenizer_config.json."""
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder, safe_serialization=True)
    train_tiny_tokenizer().save(str(folder / "tokenizer.json"))
    tokenizer_config: dict[str, Any] = {"eos_token": "<|im_end|>", "bos_token": None}
    if chat_template:
        tokenizer_config["chat_template"] = chat_template
    (folder / "tokenizer_config.json").write_text(json.dumps(tokenizer_config))
    return folder



def greedy_generate(model: CausalLM, prompt: list[int], num_tokens: int) -> list[int]:
    """Greedy decoding: one prefill, then one token per forward with the contiguous cache."""
    attention = ContiguousAttention(model.config.num_layers,
                                    sliding_window=model.config.layer_windows)
    ids = torch.tensor(prompt, dtype=torch.int64)
    hidden = model(ids, torch.arange(len(prompt)), attention)
    out: list[int] = []
    for step in range(num_tokens):
        token = int(model.compute_logits(hidden[-1:]).argmax(-1))
        out.append(token)
        position = torch.tensor([len(prompt) + step])
        hidden = model(torch.tensor([token]), position, attention)
    return out


def hf_greedy_generate(hf_model: Any, prompt: list[int], num_tokens: int) -> list[int]:
    """transformers `generate(do_sample=False)` for exactly `num_tokens` (no early stop)."""
    hf_model.generation_config.eos_token_id = None
    hf_model.generation_config.pad_token_id = 0
    with torch.inference_mode():
        out = hf_model.generate(torch.tensor([prompt]), max_new_tokens=num_tokens,
                                do_sample=False, attention_mask=torch.ones(1, len(prompt),
                                                                            dtype=torch.int64))
    return out[0, len(prompt):].tolist()
