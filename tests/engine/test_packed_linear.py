"""oneDNN-packed projections: bitwise the same logits as plain ``F.linear``, on every variant."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from prefixcache.engine.model import ContiguousAttention
from prefixcache.engine.model.packed_linear import PackedLinear, weight_packing_available
from prefixcache.engine.model_config import ModelConfig
from prefixcache.engine.weights import build_model
from prefixcache.engine.weights.hf_folder import read_hf_config, read_hf_state_dict

pytestmark = pytest.mark.skipif(
    not weight_packing_available(), reason="this torch build has no oneDNN packed linear"
)
PROMPT = [5, 17, 42, 99, 3, 250, 7, 8, 100, 101, 64, 12, 13, 200]


def logits_of(model: nn.Module, config: ModelConfig) -> torch.Tensor:  # [T, vocab]
    ids = torch.tensor(PROMPT)
    hidden = model(ids, torch.arange(len(PROMPT)), ContiguousAttention(config.num_layers))
    return model.compute_logits(hidden)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(
    ("architecture", "overrides"),
    [("llama", {}), ("llama", {"tie_word_embeddings": False}), ("qwen2", {})],
)
def test_packed_model_gives_bitwise_equal_logits(make_hf_folder, architecture, overrides, dtype):
    _, folder = make_hf_folder(architecture, **overrides)
    config, state = read_hf_config(folder), read_hf_state_dict(folder)
    plain = build_model(config, state, dtype, pack=False)
    packed = build_model(config, state, dtype, pack=True)
    per_layer = 4  # qkv, o, gate_up, down
    modules = [m for m in packed.modules() if isinstance(m, PackedLinear)]
    assert len(modules) == per_layer * config.num_layers + 1  # + the output head
    assert not any(isinstance(m, nn.Linear) for m in packed.modules())
    assert torch.equal(logits_of(packed, config), logits_of(plain, config))
    if architecture == "qwen2":  # the QKV bias travels with the packed weight
        assert packed.layers[0].attn.qkv_proj.bias is not None


def test_float16_and_disabled_packing_keep_plain_linears(make_hf_folder, monkeypatch):
    _, folder = make_hf_folder("llama")
    config, state = read_hf_config(folder), read_hf_state_dict(folder)
    assert build_model(config, state, torch.float16).pack_weights() == 0
    monkeypatch.setenv("PREFIXCACHE_PACK_WEIGHTS", "0")
    model = build_model(config, state, torch.float32)
    assert not any(isinstance(m, PackedLinear) for m in model.modules())
