"""The compiled bf16 GEMM (``linear_cpu``) against ``F.linear`` in float32 on the same values.

The kernel accumulates in float32 and rounds once to bf16, so every output is within a bf16
rounding (2^-8 relative) of the float32 product, plus float32 summation-order noise.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from prefixcache.kernels.cpu import cpu_linear_supports, linear_cpu
from prefixcache.kernels.cpu.build import unavailable_reason
from prefixcache.kernels.reference.linear import (
    linear_packed_reference,
    pack_linear_weight,
    unpack_linear_weight,
)

BF16 = torch.bfloat16
if not cpu_linear_supports(torch.zeros(16, 16, dtype=BF16)):
    pytest.skip(
        f"compiled CPU kernels unavailable: {unavailable_reason()}", allow_module_level=True
    )

# (out, in): one strip, column tails, many strips (whole strips per work item), long inputs
SHAPES = [(16, 2), (40, 64), (64, 576), (100, 96), (576, 1536), (1030, 64)]
# 1-6 rows: one register tile (decode); more: several tiles, row tails, row ranges per strip
ROWS = [1, 2, 5, 6, 7, 13, 64, 100]


def problem(rows: int, out_features: int, in_features: int, bias: bool, seed: int):
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, in_features + 6, generator=generator).to(BF16)[:, 3 : 3 + in_features]
    weight = (torch.randn(out_features, in_features, generator=generator) / in_features**0.5).to(
        BF16
    )
    b = torch.randn(out_features, generator=generator).to(BF16) if bias else None
    return x, weight, b  # x is a strided view (row stride > in_features)


@pytest.mark.parametrize("bias", [False, True], ids=["no-bias", "bias"])
@pytest.mark.parametrize("rows", ROWS)
@pytest.mark.parametrize(("out_features", "in_features"), SHAPES)
def test_matches_float32_linear(
    threads: int, out_features: int, in_features: int, rows: int, bias: bool
) -> None:
    x, weight, b = problem(rows, out_features, in_features, bias, rows * out_features)
    packed = pack_linear_weight(weight)
    got = linear_cpu(x, packed, out_features, b)
    b32 = None if b is None else b.float()
    expected = F.linear(x.float(), weight.float(), b32)
    assert got.dtype == BF16 and got.shape == (rows, out_features)
    torch.testing.assert_close(got.float(), expected, rtol=2.0**-8, atol=1e-4)
    # the oracle reads the same packed layout
    oracle = linear_packed_reference(x.float(), packed.float(), out_features, b32)
    torch.testing.assert_close(oracle, expected, rtol=1e-5, atol=1e-5)


def test_pack_round_trips_and_pads_with_zeros() -> None:
    weight = torch.randn(70, 10).to(BF16)
    packed = pack_linear_weight(weight)
    assert packed.shape == (2, 5, 64, 2)
    assert torch.equal(unpack_linear_weight(packed, 70), weight)
    assert not packed.permute(0, 2, 1, 3).reshape(128, 10)[70:].any()


def test_empty_batch() -> None:
    packed = pack_linear_weight(torch.ones(8, 4, dtype=BF16))
    assert linear_cpu(torch.zeros(0, 4, dtype=BF16), packed, 8).shape == (0, 8)


def test_unsupported_weights_and_bad_inputs() -> None:
    assert not cpu_linear_supports(torch.zeros(8, 5, dtype=BF16))  # odd in_features
    assert not cpu_linear_supports(torch.zeros(8, 4))  # float32
    packed = pack_linear_weight(torch.ones(8, 4, dtype=BF16))
    with pytest.raises(ValueError, match="features"):
        linear_cpu(torch.zeros(2, 6, dtype=BF16), packed, 8)
    with pytest.raises(ValueError, match="bfloat16"):
        linear_cpu(torch.zeros(2, 4), packed, 8)
    with pytest.raises(ValueError, match="bias"):
        linear_cpu(torch.zeros(2, 4, dtype=BF16), packed, 8, torch.zeros(7, dtype=BF16))
    with pytest.raises(ValueError, match="outputs"):
        linear_cpu(torch.zeros(2, 4, dtype=BF16), packed, 65)
    with pytest.raises(ValueError, match="even"):
        pack_linear_weight(torch.ones(8, 5, dtype=BF16))
