"""BodyMemo: a body parsed by reusing a recent one's ids equals the whole parse, whatever
follows the shared bytes."""

from __future__ import annotations

import json
import random
from typing import Any

import numpy as np
import pytest

from prefixcache.integrations.router.body_memo import SENTINEL
from prefixcache.integrations.router.request_body import BodyParser


def same(a: Any, b: Any) -> bool:
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return (isinstance(a, np.ndarray) and isinstance(b, np.ndarray) and a.dtype == b.dtype
                and np.array_equal(a, b))  # fmt: skip
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    return type(a) is type(b) and a == b


def parsed_alike(parser: BodyParser, raw: bytes) -> Any:
    """The memo's parse of ``raw``, checked against the whole parse."""
    got, whole = parser.parse(raw), parser.parse_whole(raw)
    assert same(got, whole), raw[:200]
    parser.memo.check_invariants()
    return got


def encode(body: dict[str, Any], rng: random.Random) -> bytes:
    """``body`` as a client might write it: compact or spaced, keys in any order."""
    items = list(body.items())
    rng.shuffle(items)
    separators = rng.choice([(",", ":"), (", ", ": "), (",", ": ")])
    indent = rng.choice([None, None, 1])
    return json.dumps(dict(items), separators=separators, indent=indent).encode()


@pytest.mark.parametrize("seed", range(4))
def test_agent_turns_reuse_the_last_turn_and_parse_alike(seed: int) -> None:
    rng = random.Random(seed)
    parser = BodyParser()
    history: list[int] = [rng.randrange(50_000) for _ in range(600)]
    for turn in range(30):
        body = {"model": "m", "prompt": history, "max_tokens": rng.randrange(1, 9),
                "stream": rng.random() < 0.5, "user": f"agent-{seed}"}  # fmt: skip
        raw = json.dumps(body).encode()  # one client writes one way
        parsed_alike(parser, raw)
        if turn % 5 == 4:
            parsed_alike(parser, raw)  # resent as it was
        history = history + [rng.randrange(50_000) for _ in range(rng.randrange(1, 40))]
    assert parser.memo.hits >= 29
    assert parser.memo.reused_tokens > 29 * 600


@pytest.mark.parametrize("seed", range(6))
def test_random_edits_after_a_shared_start_parse_alike(seed: int) -> None:
    """Bodies that share a start with remembered ones, then differ anywhere: in an id (also
    one digit more), in the array's end, in the other fields, or in being JSON at all."""
    rng = random.Random(100 + seed)
    parser = BodyParser()
    base = [rng.randrange(-5, 100_000) for _ in range(400)]
    raws = []
    for _ in range(12):
        raws.append(encode({"model": "m", "prompt": base, "n": 1, "stop": ["]"]}, rng))
    for _ in range(300):
        raw = bytearray(rng.choice(raws))
        edit = rng.randrange(6)
        at = rng.randrange(len(raw))
        if edit == 0:  # one byte changed
            raw[at] = ord(rng.choice('0123456789,] ["x}-.e'))
        elif edit == 1:  # a byte inserted
            raw.insert(at, ord(rng.choice('0123456789, ]["')))
        elif edit == 2:  # cut short
            del raw[at:]
        elif edit == 3:  # ids appended
            close = raw.rindex(b"]")
            extra = ", ".join(str(rng.randrange(10**6)) for _ in range(rng.randrange(1, 9)))
            raw[close:close] = b", " + extra.encode()
        elif edit == 4:  # a field after the prompt changed
            raw = bytearray(raw[:-1] + b', "prompt_cache_key": "k' + str(at).encode() + b'"}')
        else:  # something that is not an id in the array's rest
            close = raw.rindex(b"]")
            raw[close:close] = rng.choice([b", 1.5", b", [2]", b", [2], 3", b', "a"', b", 1e3",
                                           b", {}", b", 99999999999999999999", b", true"])
        parsed_alike(parser, bytes(raw))
    assert parser.memo.hits > 0


def test_the_prompt_array_is_the_one_the_whole_parse_reads() -> None:
    parser = BodyParser()
    ids = list(range(300))
    cases = [
        {"extra": {"prompt": ids}, "prompt": ids[::-1]},  # a nested "prompt" first
        {"model": "prompt", "prompt": ids},  # "prompt" as a value
        {"prompt": ids, "suffix": "]"},
        {"prompt": ids, "stop": ["a", "b"]},  # a "]" after the array's own
        {"prompt": ids, "after": SENTINEL},
    ]
    for body in cases:
        raw = json.dumps(body).encode()
        parsed_alike(parser, raw)
        parsed_alike(parser, raw.replace(b"299]", b"299, 7]"))
    # duplicate keys: the whole parse reads the first; so must the memo
    raw = b'{"prompt": [' + ", ".join(map(str, ids)).encode() + b'], "prompt": 5}'
    parsed_alike(parser, raw)
    parsed_alike(parser, raw.replace(b"299]", b"299, 8]"))
    raw = b'{"prompt": 5, "prompt": [' + ", ".join(map(str, ids)).encode() + b"]}"
    parsed_alike(parser, raw)
    parsed_alike(parser, raw.replace(b"299]", b"299, 8]"))
    escaped = b'{"\\u0070rompt": [' + ", ".join(map(str, ids)).encode() + b"]}"
    parsed_alike(parser, escaped)
    parsed_alike(parser, escaped.replace(b"299]", b"299, 9]"))


def test_short_prompts_chat_bodies_non_ids_and_non_objects_are_not_kept() -> None:
    parser = BodyParser()
    ids = ", ".join(map(str, range(300))).encode()
    for raw in [b'{"messages": [{"role": "user", "content": "hi"}]}', b"[1, 2, 3]", b"not json",
                b'{"prompt": "text"}']:  # fmt: skip
        parsed_alike(parser, raw)
    assert isinstance(parsed_alike(parser, b'{"prompt": [1, 2, 3]}')["prompt"], np.ndarray)
    for first in (b"-1", b"2147483648"):  # no token id: the prompt stays a list
        prompt = parsed_alike(parser, b'{"prompt": [' + first + b", " + ids + b"]}")["prompt"]
        assert isinstance(prompt, list) and len(prompt) == 301
    assert parser.memo._bodies == []


def test_ids_past_int32_after_a_shared_start_are_no_ids() -> None:
    parser = BodyParser()
    ids = ", ".join(map(str, range(300))).encode()
    assert isinstance(parsed_alike(parser, b'{"prompt": [' + ids + b"]}")["prompt"], np.ndarray)
    for tail in (b", 2147483648", b", -3", b", 99999999999999999999"):
        body = parsed_alike(parser, b'{"prompt": [' + ids + tail + b"]}")
        assert body is None or isinstance(body["prompt"], list)


def test_bodies_over_max_bytes_are_parsed_alike_and_not_kept() -> None:
    parser = BodyParser()
    parser.memo.max_bytes = 3000
    ids = list(range(300))
    kept = json.dumps({"prompt": ids}).encode()
    assert len(kept) < 3000 < len(kept) + 2000
    parsed_alike(parser, kept)
    assert len(parser.memo._bodies) == 1
    longer = json.dumps({"prompt": ids + list(range(1000, 1300))}).encode()
    parsed_alike(parser, longer)  # reuses the kept one, is not kept itself
    assert parser.memo.hits == 1 and len(parser.memo._bodies) == 1
    parser.memo._bodies.clear()
    parsed_alike(parser, longer)
    assert parser.memo._bodies == []


def test_capacity_bounds_what_is_kept() -> None:
    parser = BodyParser()
    rng = random.Random(7)
    for k in range(20):
        ids = [k] + [rng.randrange(1000) for _ in range(300)]
        parsed_alike(parser, json.dumps({"prompt": ids}).encode())
    assert len(parser.memo._bodies) == parser.memo.capacity
