"""Malformed or unreadable model files and names: a clear ValueError / TypeError naming them."""

from __future__ import annotations

import json
import os
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch

from prefixcache.engine import model_registry
from prefixcache.engine.model_registry import load_model, resolve_model
from prefixcache.engine.weights import GGUFFile


@pytest.fixture
def tiny_folder(make_hf_folder) -> Path:
    return make_hf_folder("llama")[1]


def _write_json(path: Path, value: object) -> None:
    path.write_text(json.dumps(value))


def _edit_config(folder: Path, **changes: object) -> None:
    config = json.loads((folder / "config.json").read_text())
    config.update(changes)
    _write_json(folder / "config.json", config)


INDEX = "model.safetensors.index.json"


@pytest.mark.parametrize(("breakage", "message"), [
    (lambda f: _write_json(f / INDEX, [1]), f"{INDEX} must hold a JSON object, got list"),
    (lambda f: _write_json(f / INDEX, {"weight_map": ["model.safetensors"]}),
     f"{INDEX}: weight_map must be an object"),
    (lambda f: _write_json(f / INDEX, {"weight_map": {"lm_head.weight": 3}}),
     "weight_map values must be shard file names"),
    (lambda f: _write_json(f / INDEX, {"weight_map": {"a": "../model.safetensors"}}),
     r"weight_map names shards outside the model's folder: \['../model.safetensors'\]"),
    (lambda f: _write_json(f / INDEX, {"weight_map": {"a": str(f / "model.safetensors")}}),
     "weight_map names shards outside the model's folder"),
    (lambda f: _edit_config(f, rope_parameters=[1]), "config.json: rope_parameters must be an"),
    (lambda f: _write_json(f / "tokenizer_config.json", ["x"]),
     "tokenizer_config.json must hold a JSON object, got list"),
    (lambda f: _write_json(f / "generation_config.json", [2]),
     "generation_config.json must hold a JSON object, got list"),
    (lambda f: _write_json(f / "generation_config.json", {"eos_token_id": "abc"}),
     "generation_config.json: eos_token_id must be a token id"),
    (lambda f: (f / "config.json").write_bytes(b'{"model_type": "\xff"}'),
     "config.json is not UTF-8 text"),
    (lambda f: (f / "chat_template.jinja").write_bytes(b"\xff\xfe"),
     "chat_template.jinja is not UTF-8 text"),
    (lambda f: _edit_config(f, hidden_act="gelu"), "hidden_act is 'gelu'"),
])
def test_malformed_files_raise_value_error_naming_them(tiny_folder, breakage, message):
    breakage(tiny_folder)
    with pytest.raises(ValueError, match=message):
        load_model(tiny_folder)


def test_swish_is_silu(tiny_folder):
    _edit_config(tiny_folder, hidden_act="swish")
    assert load_model(tiny_folder).config.architecture == "llama"


def test_tokenizer_larger_than_the_model_vocabulary_is_refused(make_hf_folder):
    _, folder = make_hf_folder("llama", vocab_size=100)  # the tiny tokenizer has 300 ids
    with pytest.raises(ValueError, match=r"token ids up to 299 but the model's vocabulary has 100"):
        load_model(folder)


def test_tokenizer_smaller_than_the_padded_vocabulary_is_fine(make_hf_folder):
    _, folder = make_hf_folder("llama", vocab_size=320)
    assert load_model(folder).config.vocab_size == 320


@pytest.mark.parametrize("array", [np.ones((4, 8), np.int8), np.ones((4, 8), np.int32)])
def test_integer_gguf_tensors_raise_value_error(tmp_path, array):
    path = tmp_path / "int.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_tensor("blk.0.ffn_up.weight", array)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(ValueError, match=r"int\.gguf: cannot dequantize tensor 'blk\.0\.ffn_up"):
        GGUFFile(path).read_tensor("blk.0.ffn_up.weight")


# ------------------------------------------------------------------ names and paths
@pytest.mark.parametrize(("name", "error", "message"), [
    ("", ValueError, "model name is empty"),
    ("  ", ValueError, "model name is empty"),
    (None, TypeError, "model must be a str or a path, got NoneType"),
    (3, TypeError, "model must be a str or a path, got int"),
    (b"smollm2", TypeError, "model must be a str or a path, got bytes"),
])
def test_empty_and_non_path_models(name, error, message):
    with pytest.raises(error, match=message):
        resolve_model(name)


def test_path_named_smollm2_means_the_packaged_model_unless_it_exists(monkeypatch, tmp_path):
    packaged = tmp_path / "packaged.gguf"
    monkeypatch.setattr(model_registry, "_smollm2_gguf", lambda: packaged)
    monkeypatch.chdir(tmp_path)
    assert resolve_model(Path("smollm2")).path == packaged
    (tmp_path / "smollm2").mkdir()
    assert resolve_model(Path("smollm2")) == model_registry.ResolvedModel("hf", Path("smollm2"))


def _deny(path: Path) -> None:
    """chmod 000, or skip where permissions are not enforced (root)."""
    path.chmod(0)
    try:
        os.listdir(path) if path.is_dir() else path.open("rb").close()
    except PermissionError:
        return
    path.chmod(0o755)
    pytest.skip("file permissions are not enforced for this user (root)")


@pytest.fixture
def restore_modes(tiny_folder):
    """The tiny folder, given back readable after the test (so tmp_path can be removed)."""
    yield tiny_folder
    tiny_folder.chmod(0o755)
    for path in tiny_folder.iterdir():
        path.chmod(0o644)


def test_unreadable_model_folder(restore_modes):
    folder = restore_modes
    _deny(folder)
    with pytest.raises(ValueError, match="cannot be read: permission denied"):
        resolve_model(folder)
    with pytest.raises(ValueError, match=r"cannot access model path .*: Permission denied"):
        resolve_model(folder / "model.gguf")


@pytest.mark.parametrize(("name", "message"), [
    ("model.safetensors", r"cannot read weights from .*model\.safetensors: Permission denied"),
    ("config.json", r"cannot read model file .*config\.json: permission denied"),
    ("tokenizer_config.json", r"cannot read model file .*tokenizer_config\.json"),
])
def test_unreadable_model_files(restore_modes, name, message):
    _deny(restore_modes / name)
    with pytest.raises(ValueError, match=message):
        load_model(restore_modes)


def test_a_sharded_checkpoint_loads_the_same_weights(make_hf_folder, tmp_path):
    """transformers' own sharded save (an index naming several shards) loads to the same
    parameters as the single-file save."""
    hf_model, single = make_hf_folder("llama")
    sharded = tmp_path / "sharded"
    sharded.mkdir()
    hf_model.save_pretrained(sharded, safe_serialization=True, max_shard_size="20KB")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (sharded / name).write_bytes((single / name).read_bytes())
    shards = json.loads((sharded / INDEX).read_text())["weight_map"].values()
    assert len(set(shards)) > 1
    expected = load_model(single, dtype=torch.float32).model.state_dict()
    loaded = load_model(sharded, dtype=torch.float32).model.state_dict()
    assert expected.keys() == loaded.keys()
    assert all(torch.equal(expected[key], loaded[key]) for key in expected)
