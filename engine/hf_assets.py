"""Tokenizer, end-of-sequence ids and chat template of a Hugging Face model folder."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from . import config_values as cv
from .chat_template import ChatTemplate, chat_template_from_tokenizer_config
from .model_config import ModelConfig
from .tokenizer import Tokenizer
from .weights.hf_folder import read_json_object


def _token_text(value: Any) -> str | None:
    """tokenizer_config.json writes special tokens as a string or {"content": ...}."""
    if isinstance(value, dict):
        return value.get("content")
    return value if isinstance(value, str) else None


def _tokenizer_config(folder: Path) -> dict[str, Any]:
    path = folder / "tokenizer_config.json"
    return read_json_object(path) if path.is_file() else {}


def load_hf_tokenizer(folder: Path, config: ModelConfig) -> Tokenizer:
    """`tokenizer.json` plus the eos ids from config.json, generation_config.json and
    tokenizer_config.json's `eos_token` (ValueError if tokenizer.json is missing, if a JSON
    file does not hold an object, or if generation_config.json's eos_token_id is no token id;
    each names the file)."""
    path = folder / "tokenizer.json"
    if not path.is_file():
        raise ValueError(f"{folder} has no tokenizer.json")
    tokenizer = Tokenizer.from_file(path)
    eos_ids = list(config.eos_token_ids)
    generation_path = folder / "generation_config.json"
    if generation_path.is_file():
        eos_ids += cv.token_ids(read_json_object(generation_path), "eos_token_id",
                                str(generation_path))
    eos_text = _token_text(_tokenizer_config(folder).get("eos_token"))
    if eos_text is not None and tokenizer.token_to_id(eos_text) is not None:
        eos_ids.append(tokenizer.token_to_id(eos_text))
    return Tokenizer(tokenizer.backend, eos_token_ids=eos_ids, bos_token_id=config.bos_token_id)


def load_hf_chat_template(folder: Path) -> ChatTemplate | None:
    """The folder's chat template (chat_template.jinja or tokenizer_config.json), if any."""
    tokenizer_config = _tokenizer_config(folder)
    jinja_path = folder / "chat_template.jinja"
    if jinja_path.is_file():
        try:
            source = jinja_path.read_text(encoding="utf-8")
        except UnicodeDecodeError as error:
            raise ValueError(f"{jinja_path} is not UTF-8 text: {error}") from error
    else:
        source = chat_template_from_tokenizer_config(tokenizer_config)
    if not source:
        return None
    return ChatTemplate(source, bos_token=_token_text(tokenizer_config.get("bos_token")),
                        eos_token=_token_text(tokenizer_config.get("eos_token")))
