"""KV sizing: exact byte counts, dtype names, presets and MHA/GQA/MQA rows."""

from fractions import Fraction

import pytest

from prefixcache.sizing import (
    MODEL_PRESETS,
    VALID_DTYPES,
    ModelShape,
    attention_variant_sizes,
    dtype_bytes,
    format_binary_bytes,
    format_decimal_bytes,
    kv_cache_bytes,
    model_preset,
)


def test_llama_70b_bf16_is_320_kib_per_token():
    assert kv_cache_bytes(80, 8, 128, "bf16") == 327_680 == 320 * 1024


def test_llama_70b_bf16_4096_tokens():
    total = kv_cache_bytes(80, 8, 128, "bf16", tokens=4096)
    assert total == 1_342_177_280
    assert format_decimal_bytes(total) == "1.34 GB"
    assert format_binary_bytes(total) == "1.25 GiB"


def test_preset_llama_70b_matches_explicit_shape():
    assert MODEL_PRESETS["llama-70b"].bytes_per_token("bfloat16") == 327_680


@pytest.mark.parametrize(
    ("dtype", "expected"),
    [
        ("fp32", 4),
        ("float32", 4),
        ("fp16", 2),
        ("float16", 2),
        ("bf16", 2),
        ("bfloat16", 2),
        ("fp8", 1),
        ("fp8_e4m3", 1),
        ("fp8_e5m2", 1),
        ("int8", 1),
        ("int4", Fraction(1, 2)),
        ("BF16", 2),
    ],
)
def test_dtype_bytes(dtype, expected):
    assert dtype_bytes(dtype) == expected


def test_formula_scales_with_every_factor():
    base = kv_cache_bytes(2, 3, 5, "fp16", tokens=7)
    assert base == 2 * 2 * 3 * 5 * 2 * 7
    assert kv_cache_bytes(4, 3, 5, "fp16", tokens=7) == 2 * base
    assert kv_cache_bytes(2, 3, 5, "fp32", tokens=7) == 2 * base
    assert kv_cache_bytes(2, 3, 5, "fp8", tokens=14) == base


def test_int4_is_half_a_byte_and_stays_an_exact_int():
    result = kv_cache_bytes(1, 1, 1, "int4", tokens=1)
    assert result == 1 and isinstance(result, int)
    assert kv_cache_bytes(80, 8, 128, "int4") * 4 == kv_cache_bytes(80, 8, 128, "bf16")


def test_unknown_dtype_lists_valid_ones():
    with pytest.raises(ValueError, match="unknown dtype") as excinfo:
        kv_cache_bytes(1, 1, 1, "fp64")
    for name in VALID_DTYPES:
        assert name in str(excinfo.value)


@pytest.mark.parametrize("bad", [0, -1])
@pytest.mark.parametrize("position", range(4))
def test_non_positive_sizes_raise_value_error(bad, position):
    args = [80, 8, 128, 4096]
    args[position] = bad
    with pytest.raises(ValueError):
        kv_cache_bytes(args[0], args[1], args[2], "bf16", tokens=args[3])


@pytest.mark.parametrize("bad", [1.5, 2.0, "8", True, None])
@pytest.mark.parametrize("position", range(4))
def test_non_integer_sizes_raise_type_error(bad, position):
    args = [80, 8, 128, 4096]
    args[position] = bad
    with pytest.raises(TypeError):
        kv_cache_bytes(args[0], args[1], args[2], "bf16", tokens=args[3])


def test_presets():
    expected = {
        "llama-70b": (80, 64, 8, 128),
        "llama-8b": (32, 32, 8, 128),
        "smollm2-135m": (30, 9, 3, 64),
        "qwen2-7b": (28, 28, 4, 128),
        "mistral-7b": (32, 32, 8, 128),
        "gemma3-1b": (26, 4, 1, 256, 22, 512),
        "gemma3-27b": (62, 32, 16, 128, 52, 1024),
        "gemma2-9b": (42, 16, 8, 256, 21, 4096),
    }
    actual = {
        name: (s.num_layers, s.num_heads, s.num_kv_heads, s.head_dim)
        + ((s.sliding_layers, s.window) if s.sliding_layers else ())
        for name, s in MODEL_PRESETS.items()
    }
    assert actual == expected
    assert model_preset("Llama-70B") is MODEL_PRESETS["llama-70b"]
    assert model_preset("smollm2") is MODEL_PRESETS["smollm2-135m"]  # the engine's name
    with pytest.raises(ValueError, match="llama-8b"):
        model_preset("gpt-5")


def test_attention_variants_llama_70b():
    rows = attention_variant_sizes(MODEL_PRESETS["llama-70b"], "bf16", tokens=4096)
    assert [(r.attention, r.num_kv_heads) for r in rows] == [("MHA", 64), ("GQA", 8), ("MQA", 1)]
    assert [r.bytes_per_token for r in rows] == [2_621_440, 327_680, 40_960]
    assert [r.bytes_total for r in rows] == [r.bytes_per_token * 4096 for r in rows]
    assert [r.is_model for r in rows] == [False, True, False]


def test_attention_kind_and_shape_validation():
    assert ModelShape(2, 4, 4, 8).attention_kind == "MHA"
    assert ModelShape(2, 4, 2, 8).attention_kind == "GQA"
    assert ModelShape(2, 4, 1, 8).attention_kind == "MQA"
    with pytest.raises(ValueError, match="divide"):
        ModelShape(2, 4, 3, 8)
    with pytest.raises(ValueError, match="divide"):
        ModelShape(2, 4, 8, 8)
    with pytest.raises(ValueError):
        ModelShape(0, 4, 4, 8)


def test_human_units():
    assert format_decimal_bytes(999) == "999 B"
    assert format_binary_bytes(1024) == "1.00 KiB"
    assert format_decimal_bytes(10**9) == "1.00 GB"
    assert format_binary_bytes(2**40) == "1.00 TiB"


@pytest.mark.parametrize(
    ("num_bytes", "decimal", "binary"),
    [
        (999_999, "1.00 MB", "976.56 KiB"),
        (999_994, "999.99 kB", "976.56 KiB"),
        (2**20 - 1, "1.05 MB", "1.00 MiB"),
        (1023, "1.02 kB", "1023 B"),
        (1_048_570, "1.05 MB", "1023.99 KiB"),
        (10**18 - 1, "1000.00 PB", "888.18 PiB"),
    ],
)
def test_unit_is_chosen_after_rounding(num_bytes: int, decimal: str, binary: str) -> None:
    """A value that rounds up to the base moves to the next unit ('1.00 MB', not '1000.00 kB');
    the last unit has no next one."""
    assert format_decimal_bytes(num_bytes) == decimal
    assert format_binary_bytes(num_bytes) == binary


@pytest.mark.parametrize("bad", [70, None, b"llama-70b", ["llama-70b"]], ids=repr)
def test_model_preset_needs_a_string(bad: object) -> None:
    """A non-string model name is a TypeError, not an AttributeError from str methods."""
    with pytest.raises(TypeError, match="string"):
        model_preset(bad)  # type: ignore[arg-type]
