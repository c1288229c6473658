"""``canonical_json``: keys stringified as JSON does, then sorted; clear errors otherwise."""

from __future__ import annotations

import pytest

from prefixcache.integrations.sdk.canonical import canonical_json, json_key


def test_int_keys_serialize_like_their_json_strings() -> None:
    assert canonical_json({10: "a", 2: "b"}) == canonical_json({"10": "a", "2": "b"})
    assert canonical_json({10: "a", 2: "b"}) == '{"10":"a","2":"b"}'


def test_mixed_key_types_sort_as_strings_at_any_depth() -> None:
    value = [{"b": 1, 2: {None: 0, 1.5: 1, True: 2}}, ({3: "x", "a": "y"},)]
    assert canonical_json(value) == (
        '[{"2":{"1.5":1,"null":0,"true":2},"b":1},[{"3":"x","a":"y"}]]')


@pytest.mark.parametrize("key", [(1, 2), frozenset(), b"k", object()])
def test_keys_json_cannot_write_are_a_type_error(key) -> None:
    with pytest.raises(TypeError, match="dict keys must be str, int, float, bool or None"):
        canonical_json({"nested": {key: 1}})


def test_keys_that_serialize_alike_are_refused() -> None:
    with pytest.raises(ValueError, match="dict keys 1 and '1' both serialize as the JSON "
                                         "key '1'"):
        canonical_json({1: "a", "1": "b"})


def test_other_values_keep_json_errors() -> None:
    with pytest.raises(ValueError, match="Out of range float"):
        canonical_json({float("nan"): 1})
    with pytest.raises(TypeError, match="set is not JSON serializable"):
        canonical_json({"a": {1, 2}})
    loop: list = []
    loop.append(loop)
    with pytest.raises(ValueError, match="Circular reference"):
        canonical_json({"a": loop})
    shared = {"x": [1]}
    assert canonical_json([shared, shared]) == '[{"x":[1]},{"x":[1]}]'  # not a cycle


def test_json_key() -> None:
    assert [json_key(k) for k in ("s", 3, 2.5, False, None)] == ["s", "3", "2.5", "false",
                                                                  "null"]
