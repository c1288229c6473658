"""Structured outputs in the engine: whatever a random model prefers, its output matches the
grammar (JSON Schema, regex, choice, Lark), through forks, preemption and prefix hits; a spec
the grammar library refuses is a clear error before anything runs."""

from __future__ import annotations

import json
import re
from pathlib import Path

import jsonschema_rs
import pytest

from prefixcache.engine.llm import LLM
from prefixcache.engine.sampling_params import SamplingParams
from prefixcache.engine.structured_output import StructuredOutput, StructuredOutputError

SCHEMA = {
    "type": "object",
    "properties": {
        "a": {"type": "integer", "minimum": 0, "maximum": 99},
        "b": {"type": "string", "maxLength": 4},
        "c": {"type": "string", "enum": ["red", "green"]},
    },
    "required": ["a", "b", "c"],
    "additionalProperties": False,
}
PROMPT = [5, 6, 7, 8, 9, 10, 11]


def engine(folder: Path, **kwargs) -> LLM:
    return LLM(str(folder), dtype="float32", num_blocks=256, block_size=4, **kwargs)


def structured(spec: StructuredOutput, temperature: float = 1.0, **kwargs) -> SamplingParams:
    options = {"max_tokens": 200, "temperature": temperature, "seed": 7, **kwargs}
    return SamplingParams(structured=spec, **options)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_a_random_model_writes_json_that_validates(tiny_llama_dir: Path,
                                                   temperature: float) -> None:  # fmt: skip
    llm = engine(tiny_llama_dir)
    validator = jsonschema_rs.validator_for(SCHEMA)
    outs = llm.generate([PROMPT, PROMPT[:3]], structured(StructuredOutput(json=SCHEMA),
                                                         temperature, n=3))  # fmt: skip
    for out in outs:
        for completion in out.outputs:
            assert completion.finish_reason == "stop", completion.text
            validator.validate(json.loads(completion.text))
    assert llm.cache.stats()["in_use"] == 0
    llm.cache.check_invariants()


def test_regex_choice_and_lark_grammar(tiny_llama_dir: Path) -> None:
    llm = engine(tiny_llama_dir)
    specs = {
        StructuredOutput(regex=r"[0-9]{3}-[a-z]{2}"): re.compile(r"[0-9]{3}-[a-z]{2}"),
        StructuredOutput(choice=("alpha", "beta", "gamma")): re.compile(r"alpha|beta|gamma"),
        StructuredOutput(grammar='start: "(" item ("," item)* ")"\nitem: /[xy]{1,3}/'):
            re.compile(r"\([xy]{1,3}(,[xy]{1,3})*\)"),
        StructuredOutput(json_object=True): None,
    }  # fmt: skip
    for spec, pattern in specs.items():
        completion = llm.generate([PROMPT], structured(spec))[0].outputs[0]
        if pattern is not None:
            assert pattern.fullmatch(completion.text), (spec, completion.text)
        elif completion.finish_reason == "stop":  # a random model may nest until max_tokens
            assert isinstance(json.loads(completion.text), dict)


def test_grammar_state_survives_preemption_and_prefix_hits(tiny_llama_dir: Path) -> None:
    """Greedy structured answers are the same from a roomy engine, from one whose pool is so
    small that requests are preempted mid-answer, and again from the cache."""
    params = structured(StructuredOutput(json=SCHEMA), temperature=0.0)
    prompts = [PROMPT + [k] * 5 for k in range(12, 18)]
    roomy = engine(tiny_llama_dir).generate(prompts, params)
    tight = LLM(str(tiny_llama_dir), dtype="float32", num_blocks=60, block_size=4)
    squeezed = tight.generate(prompts, params)
    assert tight.stats()["preemptions"] > 0
    again = tight.generate(prompts, params)
    assert all(o.num_cached_tokens > 0 for o in again)
    for a, b, c in zip(roomy, squeezed, again, strict=True):
        assert a.outputs[0].token_ids == b.outputs[0].token_ids == c.outputs[0].token_ids
    tight.cache.check_invariants()


@pytest.mark.parametrize(("spec", "problem"), [
    (StructuredOutput(json={"type": "object", "properties": {"a": {"type": "nonsense"}}}),
     "nonsense"),
    (StructuredOutput(regex="(unclosed"), "unclosed group"),
    (StructuredOutput(grammar="start: undefined_rule"), "undefined_rule"),
])  # fmt: skip
def test_a_spec_the_library_refuses_is_a_clear_error(tiny_llama_dir: Path,
                                                      spec: StructuredOutput,
                                                      problem: str) -> None:  # fmt: skip
    llm = engine(tiny_llama_dir)
    with pytest.raises(StructuredOutputError, match=problem):
        llm.generate([PROMPT], structured(spec))
    assert not llm.engine.has_unfinished()
    assert llm.generate([PROMPT], SamplingParams(max_tokens=3))[0].outputs[0].token_ids


@pytest.mark.parametrize("fields", [{}, {"json": SCHEMA, "regex": "x"}, {"choice": ()},
                                    {"regex": ""}, {"json": 5}])  # fmt: skip
def test_a_malformed_spec_is_refused_when_built(fields: dict) -> None:
    with pytest.raises((TypeError, ValueError)):
        StructuredOutput(**fields)


def test_compiled_grammars_are_cached(tiny_llama_dir: Path) -> None:
    llm = engine(tiny_llama_dir)
    spec = StructuredOutput(json=SCHEMA)
    same = StructuredOutput(json=json.dumps(SCHEMA))  # the schema as text: the same grammar
    llm.generate([PROMPT], structured(spec))
    llm.generate([PROMPT], structured(same))
    assert llm.grammars.compiled == 1
