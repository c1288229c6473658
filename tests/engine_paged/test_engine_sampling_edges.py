"""Every sampling value ``SamplingParams`` accepts is served, and the engine serves on after it.

A hypothesis search over temperatures, top-p, top-k, seeds, min-p, penalties, logit biases and
min_tokens (float edge values included: subnormals, the greedy epsilon's neighbours, each
range's ends) drives one engine; after each request the engine must still answer a greedy
request, with no block in use. Values outside the ranges are refused where they enter.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from prefixcache.engine.llm import LLM
from prefixcache.engine.sampler import sample_token
from prefixcache.engine.sampling_params import GREEDY_TEMPERATURE_EPS, SamplingParams


def numbers(low: float, high: float, *edges: float) -> st.SearchStrategy[float]:
    """Values in [low, high]: its ends, ``edges`` and the subnormals in it first. (Values
    outside are refused where they enter: ``test_out_of_range_values_are_refused``.)"""
    inside = [v for v in (low, high, *edges, 5e-324, 1e-310, 1e-45) if low <= v <= high]
    return st.one_of(st.sampled_from(inside), st.floats(low, high))


temperatures = numbers(0.0, 100.0, 1e-38, 9.999e-6, GREEDY_TEMPERATURE_EPS, 1.0000001e-5,
                       0.5, 1.0, 2.0, 99.999)
probabilities = numbers(0.0, 1.0, 1e-300, 0.5, 0.999999)
top_ps = numbers(1e-300, 1.0, 0.5, 0.999999)
penalties_2 = numbers(-2.0, 2.0, -1e-300, 0.5, 1.0)
repetition = numbers(1e-300, 10.0, 0.5, 1.0, 1.0000001, 2.0)
biases = numbers(-100.0, 100.0, -1e-300, 0.5)
top_ks = st.one_of(st.sampled_from([-1, 1, 2, 255, 256, 257, 2**31, 2**63]),
                   st.integers(-1, 1000).filter(bool))
seeds = st.one_of(st.none(), st.sampled_from([0, -1, -(2**63), 2**63 - 1, 2**64 - 1]),
                  st.integers(-(2**63), 2**64 - 1))


@pytest.fixture(scope="module")
def engine(tiny_llama_dir: Path) -> LLM:
    return LLM(str(tiny_llama_dir), dtype="float32", num_blocks=64, block_size=4)


@settings(max_examples=80, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(temperature=temperatures, top_p=top_ps, top_k=top_ks, seed=seeds,
       n=st.integers(1, 3), penalties=st.fixed_dictionaries({}, optional={
           "presence_penalty": penalties_2, "frequency_penalty": penalties_2,
           "repetition_penalty": repetition, "min_p": probabilities,
           "min_tokens": st.integers(0, 3),
           "logit_bias": st.dictionaries(st.integers(0, 383), biases, max_size=3)}))
def test_any_accepted_sampling_values_leave_the_engine_serving(
    engine: LLM, temperature: float, top_p: float, top_k: int, seed: int | None, n: int,
    penalties: dict,
) -> None:
    try:
        params = SamplingParams(max_tokens=3, temperature=temperature, top_p=top_p,
                                top_k=top_k, seed=seed, n=n, ignore_eos=True, **penalties)
    except (TypeError, ValueError) as error:
        raise AssertionError(f"an in-range value was refused: {error}") from error
    (output,) = engine.generate([[5, 6, 7, 8, 9]], params)
    assert output.error is None
    vocab = engine.config.vocab_size
    assert all(len(o.token_ids) == 3 and all(0 <= t < vocab for t in o.token_ids)
               for o in output.outputs)
    (after,) = engine.generate([[1, 2, 3]], SamplingParams(max_tokens=2, temperature=0.0))
    assert after.error is None and len(after.token_ids) == 2
    engine.cache.check_invariants()
    engine.engine.scheduler.check_invariants()
    assert engine.stats()["in_use"] == 0 and engine.stats()["request_errors"] == 0


NOT_A_NUMBER = [math.nan, math.inf, -math.inf, "1", None, True]
REFUSED = {
    "temperature": [-1e-300, -1.0, 100.0000001, 1e308, *NOT_A_NUMBER],
    "top_p": [0.0, -1e-300, 1.0000001, *NOT_A_NUMBER],
    "min_p": [-1e-300, 1.0000001, *NOT_A_NUMBER],
    "presence_penalty": [-2.0000001, 2.5, -1e308, *NOT_A_NUMBER],
    "frequency_penalty": [-2.0000001, 2.5, 1e308, *NOT_A_NUMBER],
    "repetition_penalty": [0.0, -1.0, 10.5, *NOT_A_NUMBER],
}


@pytest.mark.parametrize(("field", "value"),
                         [(f, v) for f, values in REFUSED.items() for v in values])
def test_out_of_range_values_are_refused(field: str, value: object) -> None:
    with pytest.raises((TypeError, ValueError), match=field):
        SamplingParams(**{field: value})


def test_a_temperature_below_the_greedy_epsilon_is_greedy() -> None:
    for temperature in (5e-324, 1e-38, 9.99e-6):
        assert SamplingParams(temperature=temperature).temperature == 0.0
    assert SamplingParams(temperature=GREEDY_TEMPERATURE_EPS).temperature == GREEDY_TEMPERATURE_EPS


@pytest.mark.parametrize("row", [
    [math.nan, 1.0, 2.0, math.nan],
    [math.nan] * 4,
    [-math.inf] * 4,
    [math.inf, 1.0, math.inf, 0.0],
    [3e38, -3e38, 3e38, 0.0],
], ids=["some-nan", "all-nan", "all-minus-inf", "plus-inf", "huge"])
@pytest.mark.parametrize("top_p", [1.0, 0.5, 1e-300])
def test_the_sampler_draws_a_token_from_any_row(row: list[float], top_p: float) -> None:
    logits = torch.tensor(row, dtype=torch.float32)  # [vocab]
    params = SamplingParams(temperature=GREEDY_TEMPERATURE_EPS, top_p=top_p, top_k=2)
    generator = torch.Generator().manual_seed(0)
    token = sample_token(logits, params, generator)
    assert 0 <= token < len(row)
    finite = [v for v in row if not math.isnan(v)]
    if finite and max(finite) > -math.inf:  # a best token exists: the draw is one of them
        assert row[token] == max(finite)
