"""Every sampling value ``SamplingParams`` accepts is served, and the engine serves on after it.

A hypothesis search over temperatures, top-p, top-k and seeds (float edge values included:
subnormals, the greedy epsilon's neighbours, the range's ends) drives one engine; after each
request the engine must still answer a greedy request, with no block in use.
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

EDGE_FLOATS = [0.0, 5e-324, 1e-310, 1e-45, 1e-38, 9.999e-6, GREEDY_TEMPERATURE_EPS, 1.0000001e-5,
               1e-4, 0.5, 1.0, 2.0, 99.999, 100.0, 100.0000001, -0.0, -1e-300, math.inf,
               -math.inf, math.nan, 1e308]
temperatures = st.one_of(st.sampled_from(EDGE_FLOATS), st.floats(allow_nan=True))
top_ps = st.one_of(st.sampled_from([*EDGE_FLOATS, 1e-300, 0.999999]), st.floats())
top_ks = st.one_of(st.sampled_from([-2, -1, 0, 1, 2, 255, 256, 257, 2**31, 2**63, 2**64]),
                   st.integers())
seeds = st.one_of(st.none(), st.sampled_from([0, -1, -(2**63), 2**63 - 1, 2**64 - 1, 2**64]),
                  st.integers())


@pytest.fixture(scope="module")
def engine(tiny_llama_dir: Path) -> LLM:
    return LLM(str(tiny_llama_dir), dtype="float32", num_blocks=64, block_size=4)


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(temperature=temperatures, top_p=top_ps, top_k=top_ks, seed=seeds, n=st.integers(1, 3))
def test_any_accepted_sampling_values_leave_the_engine_serving(
    engine: LLM, temperature: float, top_p: float, top_k: int, seed: int | None, n: int
) -> None:
    try:
        params = SamplingParams(max_tokens=3, temperature=temperature, top_p=top_p,
                                top_k=top_k, seed=seed, n=n, ignore_eos=True)
    except (TypeError, ValueError):
        return  # refused where it enters: the server answers 400
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
