"""Tiny random Hugging Face Llama / Qwen2 folders, built in process (no hub access)."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

TRAINING_TEXT = [
    "You are a helpful assistant. Answer briefly and cite the documents you use.",
    "The quick brown fox jumps over the lazy dog. Paris is the capital of France.",
    "def add(a, b):\n    return a + b\n# tools: search, calculator, weather",
] * 20


def build_tokenizer(vocab_size: int = 320) -> Tokenizer:
    """A byte-level BPE with an end-of-text token (id 0)."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=["<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(TRAINING_TEXT, trainer)
    return tokenizer


# GQA 6/2 with head_dim 64: a shape the compiled CPU attention kernel takes in bf16.
HEAD_DIM_64 = {"hidden_size": 384, "num_attention_heads": 6, "num_key_value_heads": 2}


def make_tiny_model_dir(folder: Path, architecture: str = "llama", seed: int = 0,
                        **overrides: int) -> Path:
    """Write a random 2-layer model (GQA 4/2 heads, head_dim 16 unless ``overrides`` change
    the config) + tokenizer.json into ``folder``."""
    import transformers

    tokenizer = build_tokenizer()
    common = dict(
        vocab_size=384,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        eos_token_id=0,
        bos_token_id=None,
        tie_word_embeddings=architecture == "llama",
    )
    common.update(overrides)
    torch.manual_seed(seed)
    if architecture == "llama":
        config = transformers.LlamaConfig(**common)
        model = transformers.LlamaForCausalLM(config)
    elif architecture == "qwen2":
        config = transformers.Qwen2Config(**common)
        model = transformers.Qwen2ForCausalLM(config)
    elif architecture == "mistral":
        config = transformers.MistralConfig(**common)
        model = transformers.MistralForCausalLM(config)
    elif architecture == "gemma2":
        common.setdefault("head_dim", common["hidden_size"] // common["num_attention_heads"])
        config = transformers.Gemma2Config(**common)
        model = transformers.Gemma2ForCausalLM(config)
    elif architecture == "gemma3":
        common.setdefault("head_dim", common["hidden_size"] // common["num_attention_heads"])
        config = transformers.Gemma3TextConfig(**common)
        model = transformers.Gemma3ForCausalLM(config)
    else:
        raise ValueError(architecture)
    with torch.no_grad():  # sharper logits than the default init, so greedy has few near-ties
        for param in model.parameters():
            if param.dim() > 1:
                param.normal_(0.0, 0.08)
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder, safe_serialization=True)
    tokenizer.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<|endoftext|>"}))
    return folder
