"""Packed projections: oneDNN's (float32, or bf16 with the reference backend) give bitwise the
same logits as plain ``F.linear``; the compiled bf16 GEMM gives them to bf16 rounding, the
compiled float32 GEMM to float32 rounding."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from prefixcache.engine.model import ContiguousAttention
from prefixcache.engine.model.packed_linear import (
    PackedLinear,
    packable_dtype,
    weight_packing_available,
)
from prefixcache.engine.model_config import ModelConfig
from prefixcache.engine.weights import build_model
from prefixcache.engine.weights.hf_folder import read_hf_config, read_hf_state_dict
from prefixcache.kernels import kernel_backend
from prefixcache.kernels.dispatch import cpu_kernels

pytestmark = pytest.mark.skipif(
    not weight_packing_available(), reason="this torch build has no oneDNN packed linear"
)
PROMPT = [5, 17, 42, 99, 3, 250, 7, 8, 100, 101, 64, 12, 13, 200]


def logits_of(model: nn.Module, config: ModelConfig) -> torch.Tensor:  # [T, vocab]
    ids = torch.tensor(PROMPT)
    hidden = model(ids, torch.arange(len(PROMPT)), ContiguousAttention(config.num_layers))
    return model.compute_logits(hidden)


VARIANTS = [("llama", {}), ("llama", {"tie_word_embeddings": False}), ("qwen2", {})]


def packed_and_plain(make_hf_folder, architecture, overrides, dtype):
    _, folder = make_hf_folder(architecture, **overrides)
    config, state = read_hf_config(folder), read_hf_state_dict(folder)
    plain = build_model(config, state, dtype, pack=False)
    packed = build_model(config, state, dtype, pack=True)
    per_layer = 4  # qkv, o, gate_up, down
    modules = [m for m in packed.modules() if isinstance(m, PackedLinear)]
    assert len(modules) == per_layer * config.num_layers + 1  # + the output head
    assert not any(isinstance(m, nn.Linear) for m in packed.modules())
    if architecture == "qwen2":  # the QKV bias travels with the packed weight
        assert packed.layers[0].attn.qkv_proj.bias is not None
    return config, packed, plain, modules


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("architecture", "overrides"), VARIANTS)
def test_onednn_packed_model_gives_bitwise_equal_logits(
    make_hf_folder, architecture, overrides, dtype
):
    if not packable_dtype(dtype):
        pytest.skip(f"oneDNN cannot pack {dtype} on this CPU (no AVX-512 or AVX-NE-CONVERT)")
    with kernel_backend("reference"):  # bf16 too: oneDNN's packing, not the compiled GEMM
        config, packed, plain, modules = packed_and_plain(
            make_hf_folder, architecture, overrides, dtype
        )
    assert not any(m.compiled for m in modules)
    assert torch.equal(logits_of(packed, config), logits_of(plain, config))


@pytest.mark.parametrize(("architecture", "overrides"), VARIANTS)
def test_compiled_bf16_gemm_gives_the_same_logits_to_rounding(
    make_hf_folder, architecture, overrides
):
    if not cpu_kernels().cpu_linear_supports(torch.zeros(2, 2, dtype=torch.bfloat16)):
        pytest.skip("the compiled CPU kernels are unavailable on this machine")
    config, packed, plain, modules = packed_and_plain(
        make_hf_folder, architecture, overrides, torch.bfloat16
    )
    assert all(m.compiled for m in modules)
    got, expected = logits_of(packed, config), logits_of(plain, config)
    assert (got - expected).abs().max() <= 0.02 * expected.abs().max()
    assert torch.equal(got.argmax(-1), expected.argmax(-1))


@pytest.mark.parametrize(("architecture", "overrides"), VARIANTS)
def test_compiled_f32_gemm_gives_the_same_logits_to_rounding(
    make_hf_folder, architecture, overrides
):
    if not cpu_kernels().f32_linear_supports(torch.zeros(2, 2)):
        pytest.skip("the compiled float32 GEMM is unavailable on this machine")
    config, packed, plain, modules = packed_and_plain(
        make_hf_folder, architecture, overrides, torch.float32
    )
    assert all(m.compiled_f32 and not m.compiled for m in modules)
    assert "compiled float32 GEMM" in repr(modules[0])
    got, expected = logits_of(packed, config), logits_of(plain, config)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
    assert torch.equal(got.argmax(-1), expected.argmax(-1))


def test_float16_and_disabled_packing_keep_plain_linears(make_hf_folder, monkeypatch):
    _, folder = make_hf_folder("llama")
    config, state = read_hf_config(folder), read_hf_state_dict(folder)
    assert build_model(config, state, torch.float16).pack_weights() == 0
    monkeypatch.setenv("PREFIXCACHE_PACK_WEIGHTS", "0")
    model = build_model(config, state, torch.float32)
    assert not any(isinstance(m, PackedLinear) for m in model.modules())


def test_bf16_stays_plain_where_onednn_cannot_pack_it(make_hf_folder, monkeypatch):
    """On a CPU without AVX-512 (oneDNN's bf16 reorder raises there) a bf16 model loads with
    plain linears and computes what an unpacked model computes; float32 is still packed."""
    monkeypatch.setattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", lambda: False)
    assert not packable_dtype(torch.bfloat16) and packable_dtype(torch.float32)
    _, folder = make_hf_folder("llama")
    config, state = read_hf_config(folder), read_hf_state_dict(folder)
    plain = build_model(config, state, torch.bfloat16, pack=False)
    loaded = build_model(config, state, torch.bfloat16)
    assert not any(isinstance(m, PackedLinear) for m in loaded.modules())
    assert torch.equal(logits_of(loaded, config), logits_of(plain, config))
    assert any(
        isinstance(m, PackedLinear) for m in build_model(config, state, torch.float32).modules()
    )
