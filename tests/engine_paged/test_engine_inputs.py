"""Bad input gets a clear error; the engine keeps serving with no block leaked."""

from __future__ import annotations

from pathlib import Path

import pytest

from prefixcache.engine.llm import LLM
from prefixcache.engine.sampling_params import SamplingParams


@pytest.fixture(scope="module")
def llm(tiny_llama_dir: Path) -> LLM:
    return LLM(str(tiny_llama_dir), dtype="float32", num_blocks=32, block_size=4, max_model_len=64)


@pytest.mark.parametrize(
    ("prompt", "message"),
    [
        ([], "no prompts"),
        ([[]], "empty"),
        ("", "empty"),
        ([[1, 2, 10_000]], "outside the vocabulary"),
        ([[1, -2]], "outside the vocabulary"),
        ([list(range(1, 80))], "max_model_len"),
        ([[1, 2**70]], "64 bits"),
    ],
)
def test_bad_prompts_raise_value_error(llm: LLM, prompt: object, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        llm.generate(prompt, SamplingParams(max_tokens=4))
    assert llm.generate([[1, 2, 3]], SamplingParams(max_tokens=2))[0].token_ids
    assert llm.stats()["in_use"] == 0
    llm.cache.check_invariants()


@pytest.mark.parametrize("prompt", [3.5, [1.5, 2.0], [[1, 2], 7], {"a": 1}, [[1, True, 3]]])
def test_wrong_types_raise_type_error(llm: LLM, prompt: object) -> None:
    with pytest.raises(TypeError):
        llm.generate(prompt, SamplingParams(max_tokens=4))


def test_single_prompt_calls_refuse_a_list_of_prompts(llm: LLM) -> None:
    """encode and warm take one prompt: a list of them is refused, not cut to its first, and
    an empty token list is an empty prompt."""
    for call in (llm.encode, llm.warm):
        with pytest.raises(TypeError, match="a prompt must be a string or a list of int"):
            call(["hello", "there"])
        with pytest.raises(ValueError, match="the prompt is empty"):
            call([])
    assert llm.encode([5, 6]) == [5, 6]
    assert llm.warm([5, 6, 7, 8, 9]) == 5
    assert llm.stats()["in_use"] == 0
    llm.cache.check_invariants()


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"max_tokens": 0}, ValueError),
        ({"max_tokens": "3"}, TypeError),
        ({"temperature": -1.0}, ValueError),
        ({"top_p": 0.0}, ValueError),
        ({"top_k": 0}, ValueError),
        ({"n": 0}, ValueError),
        ({"stop": [""]}, TypeError),
        ({"seed": 2**64}, ValueError),
        ({"seed": -(2**63) - 1}, ValueError),
        ({"seed": 1.5}, TypeError),
    ],
)
def test_bad_sampling_params(kwargs: dict, error: type) -> None:
    with pytest.raises(error):
        SamplingParams(**kwargs)


def test_unknown_model_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="no-such-model"):
        LLM("no-such-model")
    with pytest.raises(ValueError):
        LLM(str(tmp_path / "missing-folder"))


def test_request_larger_than_the_pool(tiny_llama_dir: Path) -> None:
    llm = LLM(str(tiny_llama_dir), dtype="float32", num_blocks=4, block_size=4)
    with pytest.raises(ValueError, match="KV blocks"):
        llm.generate([list(range(1, 30))], SamplingParams(max_tokens=4))
    assert llm.stats()["in_use"] == 0


def test_abort_frees_blocks(llm: LLM) -> None:
    engine = llm.engine
    engine.add_request("abort-me", list(range(1, 20)), SamplingParams(max_tokens=30))
    engine.step()
    assert llm.stats()["in_use"] > 0
    final = engine.abort("abort-me")
    assert final is not None and final.finished and final.finish_reason == "abort"
    assert engine.abort("abort-me") is None
    assert llm.stats()["in_use"] == 0 and not engine.has_unfinished()
    llm.cache.check_invariants()


def test_stop_strings_and_token_ids(llm: LLM) -> None:
    free = llm.generate(
        [[5, 6, 7]], SamplingParams(max_tokens=10, temperature=0.0, ignore_eos=True)
    )[0]
    stop_token = free.token_ids[3]
    stopped = llm.generate(
        [[5, 6, 7]],
        SamplingParams(
            max_tokens=10, temperature=0.0, stop_token_ids=[stop_token], ignore_eos=True
        ),
    )[0]
    assert stopped.token_ids == free.token_ids[: free.token_ids.index(stop_token) + 1]
    assert stopped.finish_reason == "stop" and stopped.outputs[0].stop_reason == stop_token
    assert free.finish_reason == "length"
