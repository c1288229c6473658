"""The greedy screen (``screened_argmax``) gives exactly the argmax of the full bf16 logits of
``linear_cpu``, the lowest index among equal maxima, on heads built to be hard for it: exact
ties, ties made by bf16 rounding, near-ties one bf16 step apart, negative logits beside the
zero padding of the last strip, strides and tails."""

from __future__ import annotations

import pytest
import torch

from prefixcache.kernels.cpu import GreedyScreen, greedy_screen_available, linear_cpu
from prefixcache.kernels.cpu.greedy_screen import SCREEN_ROWS_MAX, strips_left
from prefixcache.kernels.cpu.greedy_screen import screened_argmax as screened_argmax_paying
from prefixcache.kernels.reference.linear import pack_linear_weight

BF16 = torch.bfloat16
if not greedy_screen_available():
    pytest.skip("the greedy screen needs the compiled kernels and AVX512-VNNI",
                allow_module_level=True)  # fmt: skip


def screened_argmax(x: torch.Tensor, screen: GreedyScreen, packed: torch.Tensor):
    """The screen's answer whatever the number of strips left to compute exactly (whether the
    screen pays is not what these tests check)."""
    return screened_argmax_paying(x, screen, packed, max_exact_strips=packed.shape[0])


def full_argmax(x: torch.Tensor, packed: torch.Tensor, out_features: int) -> torch.Tensor:
    return linear_cpu(x, packed, out_features).float().argmax(dim=-1)


def head_with_winners(out_features: int, in_features: int, rows: int, seed: int):
    """A random head and rows, each row close to one column of the head (a clear winner, as a
    trained head's rows mostly have), with outliers in x as real hidden states have."""
    generator = torch.Generator().manual_seed(seed)
    weight = torch.randn(out_features, in_features, generator=generator) * 0.05
    winners = torch.randint(0, out_features, (rows,), generator=generator)
    x = weight[winners] * 40 + torch.randn(rows, in_features, generator=generator)
    if in_features > 5:
        weight[:, 3] *= 8  # an outlier dimension, as trained embeddings have
        x[:, 5] *= 10  # an outlier activation
    return x.to(BF16), weight.to(BF16)


@pytest.mark.parametrize(
    ("out_features", "in_features"), [(49152 // 8, 576), (1000, 70), (64, 2), (130, 256)]
)
@pytest.mark.parametrize("rows", [1, 2, 3, SCREEN_ROWS_MAX])
def test_equals_the_full_argmax(out_features: int, in_features: int, rows: int) -> None:
    for seed in range(3):
        x, weight = head_with_winners(out_features, in_features, rows, seed)
        packed = pack_linear_weight(weight)
        screen = GreedyScreen.of(weight)
        got = screened_argmax(x, screen, packed)
        assert got is not None, "the screen gave up on rows with clear winners"
        assert torch.equal(got, full_argmax(x, packed, out_features))


def test_a_strided_row_view() -> None:
    x, weight = head_with_winners(500, 64, 4, seed=7)
    wide = torch.zeros(4, 80, dtype=BF16)
    wide[:, 8:72] = x
    packed, screen = pack_linear_weight(weight), GreedyScreen.of(weight)
    assert torch.equal(screened_argmax(wide[:, 8:72], screen, packed), full_argmax(x, packed, 500))


def test_exact_ties_go_to_the_lowest_index() -> None:
    x, weight = head_with_winners(700, 128, 2, seed=1)
    weight[650] = weight[9] = (x[0] * 0.1).to(BF16)  # row 0's best, twice
    weight[300] = weight[640] = (x[1] * 0.1).to(BF16)  # row 1's best, twice
    packed, screen = pack_linear_weight(weight), GreedyScreen.of(weight)
    expected = full_argmax(x, packed, 700)
    assert expected.tolist() == [9, 300]
    assert torch.equal(screened_argmax(x, screen, packed), expected)


def test_ties_made_by_bf16_rounding_and_near_ties() -> None:
    """Columns whose float32 sums differ but round to the same bf16 logit (the lower index
    must win), and columns one bf16 step above the lower-index best (the higher must win)."""
    generator = torch.Generator().manual_seed(3)
    x = torch.randn(1, 96, generator=generator).to(BF16)
    base = torch.randn(96, generator=generator) * 0.01
    weight = (torch.randn(900, 96, generator=generator) * 0.01).to(BF16)
    weight[100] = (x[0].float() * 0.2 + base).to(BF16)
    logit = float(linear_cpu(x, pack_linear_weight(weight[100:101]), 1))
    for column in (500, 800):
        weight[column] = weight[100]
        weight[column, 50] += 0.01 * (column - 650) / 150  # a float32 change below a bf16 step
    packed = pack_linear_weight(weight)
    logits = linear_cpu(x, packed, 900).float()[0]
    assert logits[100] == logits[500] == logits[800] == logit  # tied after rounding
    assert torch.equal(screened_argmax(x, GreedyScreen.of(weight), packed), torch.tensor([100]))
    step = torch.tensor(logit).to(BF16).float().nextafter(torch.tensor(float("inf")))
    weight[850] = (x[0].float() * 0.2 * 1.02 + base).to(BF16)  # just above
    packed = pack_linear_weight(weight)
    expected = full_argmax(x, packed, 900)
    assert linear_cpu(x, packed, 900).float()[0].max() >= step.to(BF16).float()
    assert torch.equal(screened_argmax(x, GreedyScreen.of(weight), packed), expected)


def test_negative_logits_never_pick_the_padding() -> None:
    """Every logit negative: the zero columns that pad the last strip must not win."""
    x, weight = head_with_winners(100, 64, 3, seed=2)  # 28 padding columns
    weight = -weight.abs() - 0.01
    x = x.abs() + 0.01
    packed, screen = pack_linear_weight(weight), GreedyScreen.of(weight)
    expected = full_argmax(x, packed, 100)
    assert linear_cpu(x, packed, 100).float().max() < 0
    got = screened_argmax(x, screen, packed)
    assert got is not None and torch.equal(got, expected) and int(got.max()) < 100


def test_what_the_screen_declines() -> None:
    x, weight = head_with_winners(300, 64, SCREEN_ROWS_MAX + 1, seed=4)
    packed, screen = pack_linear_weight(weight), GreedyScreen.of(weight)
    assert screened_argmax(x, screen, packed) is None  # too many rows
    assert screened_argmax(x[:0], screen, packed) is None  # no rows
    bad = x[:2].clone()
    bad[1, 7] = float("nan")
    assert screened_argmax(bad, screen, packed) is None
    bad[1, 7] = float("inf")
    assert screened_argmax(bad, screen, packed) is None
    flat = torch.zeros(1, 64, dtype=BF16)  # every logit 0: every strip is left
    assert screened_argmax_paying(flat, screen, packed) is None
    assert torch.equal(screened_argmax(flat, screen, packed), torch.tensor([0]))
    with pytest.raises(ValueError, match="bfloat16"):
        screened_argmax(x.float(), screen, packed)
    with pytest.raises(ValueError, match="fit"):
        screened_argmax(x[:, :32], screen, packed)
    with pytest.raises(ValueError, match="bf16"):
        GreedyScreen.of(weight.float())


def test_rows_with_clear_winners_leave_few_strips() -> None:
    x, weight = head_with_winners(49152, 576, 1, seed=6)
    packed, screen = pack_linear_weight(weight), GreedyScreen.of(weight)
    assert 1 <= strips_left(x, screen, packed) <= 8  # of 768
    got = screened_argmax_paying(x, screen, packed)
    assert got is not None and torch.equal(got, full_argmax(x, packed, 49152))
    assert strips_left(x.float().to(BF16).repeat(SCREEN_ROWS_MAX + 1, 1), screen, packed) == 0


def test_the_copy_is_half_the_head() -> None:
    _, weight = head_with_winners(4096, 576, 1, seed=5)
    screen = GreedyScreen.of(weight)
    assert screen.q.nbytes == weight.nbytes // 2
    assert screen.nbytes < 0.52 * weight.nbytes
