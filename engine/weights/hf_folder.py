"""Read a Hugging Face model folder: config.json + *.safetensors (Llama / Mistral / Qwen2)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from safetensors.torch import load_file
from torch import Tensor

from ..model_config import ModelConfig


def read_json(path: Path) -> Any:
    """Parse a JSON file; bytes that are not UTF-8 or a syntax error become a ValueError
    naming the file."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError as error:
        raise ValueError(f"{path} is not UTF-8 text: {error}") from error
    except json.JSONDecodeError as error:
        raise ValueError(f"{path} is not valid JSON: {error}") from error


def read_json_object(path: Path) -> dict[str, Any]:
    """`read_json` for files that must hold a JSON object (ValueError naming the file)."""
    value = read_json(path)
    if not isinstance(value, dict):
        raise ValueError(f"{path} must hold a JSON object, got {type(value).__name__}")
    return value


def read_hf_config(folder: Path) -> ModelConfig:
    """`ModelConfig` from `folder/config.json`."""
    config_path = folder / "config.json"
    if not config_path.is_file():
        raise ValueError(f"{folder} has no config.json")
    return ModelConfig.from_hf_config(read_json(config_path))


def safetensors_files(folder: Path) -> list[Path]:
    """The checkpoint's shards: those named by `model.safetensors.index.json`, else
    `model.safetensors`, else every `*.safetensors` (ValueError if none)."""
    index_path = folder / "model.safetensors.index.json"
    if index_path.is_file():
        files = [folder / name for name in _index_shard_names(index_path)]
        missing = [f.name for f in files if not f.is_file()]
        if missing or not files:
            raise ValueError(f"{index_path} names missing shard(s): {missing or 'none listed'}")
        return files
    if (folder / "model.safetensors").is_file():
        return [folder / "model.safetensors"]
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise ValueError(f"{folder} has no *.safetensors weight files")
    return files


def _index_shard_names(index_path: Path) -> list[str]:
    """The sorted shard file names an index's `weight_map` ({tensor: file}) refers to; each
    must be a plain file name in the index's folder (no directories, no `..`)."""
    weight_map = read_json_object(index_path).get("weight_map") or {}
    if not isinstance(weight_map, dict):
        raise ValueError(f"{index_path}: weight_map must be an object, got {weight_map!r:.80}")
    names = set(weight_map.values())
    if not all(isinstance(name, str) and name for name in names):
        raise ValueError(f"{index_path}: weight_map values must be shard file names")
    outside = sorted(name for name in names if Path(name).name != name or name in (".", ".."))
    if outside:
        raise ValueError(f"{index_path}: weight_map names shards outside the model's folder: "
                         f"{outside[:3]} (a shard is a file name in the folder)")
    return sorted(names)


def _check_readable(path: Path) -> None:
    """ValueError naming `path` with the real reason it cannot be opened (safetensors reports
    every failure to open, a denied permission included, as "No such file or directory")."""
    try:
        with path.open("rb"):
            pass
    except OSError as error:
        raise ValueError(f"cannot read weights from {path}: {error.strerror}") from error


def read_hf_state_dict(folder: Path) -> dict[str, Tensor]:
    """All tensors of all shards, under their HF names (ValueError on a duplicate name)."""
    tensors: dict[str, Tensor] = {}
    for path in safetensors_files(folder):
        _check_readable(path)
        try:
            shard = load_file(str(path))
        except Exception as error:  # safetensors raises its own error types
            raise ValueError(f"cannot read weights from {path}: {error}") from error
        duplicate = tensors.keys() & shard.keys()
        if duplicate:
            raise ValueError(f"tensor {sorted(duplicate)[0]!r} appears in two shards")
        tensors.update(shard)
    return tensors
