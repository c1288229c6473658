"""The compiled float32 (AVX2/FMA) GEMM against ``F.linear``: float32 rounding apart, the same
products; every row's result independent of the other rows in the call (what makes a cached
answer equal an uncached one when prompts are cut into different chunks)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from prefixcache.kernels.cpu import f32_linear_supports, linear_f32, pack_f32_weight
from prefixcache.kernels.cpu.build import F32_LIBRARY, unavailable_reason

if not f32_linear_supports(torch.zeros(2, 2)):
    pytest.skip(
        f"float32 CPU GEMM unavailable: {unavailable_reason(F32_LIBRARY)}",
        allow_module_level=True,
    )


@pytest.mark.parametrize("rows", [1, 5, 6, 7, 64, 97, 200])
@pytest.mark.parametrize(("k", "n_out"), [(64, 192), (96, 100), (40, 7), (576, 960)])
def test_matches_f_linear(rows: int, k: int, n_out: int, threads: int) -> None:
    generator = torch.Generator().manual_seed(rows * 1000 + n_out)
    weight = torch.randn((n_out, k), generator=generator)
    bias = torch.randn(n_out, generator=generator)
    x = torch.randn((rows, k), generator=generator)
    packed = pack_f32_weight(weight)
    assert packed.shape == (-(-n_out // 16), k, 16)
    tolerance = 1e-6 * k  # float32 sums of k unit-variance products, in another order
    got = linear_f32(x, packed, n_out, bias)
    torch.testing.assert_close(got, F.linear(x, weight, bias), atol=tolerance, rtol=tolerance)
    torch.testing.assert_close(linear_f32(x, packed, n_out), F.linear(x, weight),
                               atol=tolerance, rtol=tolerance)  # fmt: skip


def test_rows_do_not_depend_on_the_rest_of_the_call(threads: int) -> None:
    generator = torch.Generator().manual_seed(0)
    weight = torch.randn((100, 576), generator=generator)
    x = torch.randn((131, 576), generator=generator)
    packed = pack_f32_weight(weight)
    whole = linear_f32(x, packed, 100)
    pieces = [linear_f32(x[a:b], packed, 100) for a, b in ((0, 1), (1, 8), (8, 100), (100, 131))]
    assert torch.equal(torch.cat(pieces), whole)
    assert torch.equal(linear_f32(x[::2], packed, 100), whole[::2])  # strided rows


def test_empty_rows_and_bad_inputs() -> None:
    weight = torch.randn((20, 8))
    packed = pack_f32_weight(weight)
    assert linear_f32(torch.zeros((0, 8)), packed, 20).shape == (0, 20)
    with pytest.raises(ValueError, match="float32"):
        linear_f32(torch.zeros((2, 8), dtype=torch.bfloat16), packed, 20)
    with pytest.raises(ValueError, match="x must be"):
        linear_f32(torch.zeros((2, 9)), packed, 20)
    with pytest.raises(ValueError, match="not 40 columns"):
        linear_f32(torch.zeros((2, 8)), packed, 40)
    with pytest.raises(ValueError, match="bias"):
        linear_f32(torch.zeros((2, 8)), packed, 20, torch.zeros(19))


def test_supports_only_2d_cpu_float32() -> None:
    assert f32_linear_supports(torch.zeros(4, 8))
    assert not f32_linear_supports(torch.zeros(4, 8, dtype=torch.bfloat16))
    assert not f32_linear_supports(torch.zeros(4, 8, 2))
