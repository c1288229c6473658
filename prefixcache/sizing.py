"""KV-cache sizing: how many bytes the attention keys and values of a model take.

The KV cache stores one key and one value vector per token, per layer, per KV head::

    bytes = 2 (K and V) x layers x kv_heads x head_dim x bytes(dtype) x tokens

Worked example (Llama-3-70B, bf16): 2 x 80 x 8 x 128 x 2 = 327,680 bytes = 320 KiB per
token, so a 4,096-token request holds 1,342,177,280 bytes (1.34 GB, 1.25 GiB) of KV.
Grouped-query attention (8 KV heads instead of 64) is what keeps it that small: the same
model with full multi-head attention would need 2.5 MiB per token.

Pure Python; no third-party imports.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction
from typing import NamedTuple

# Bytes per stored element. Fractions keep int4 (half a byte) exact.
_DTYPE_BYTES: dict[str, Fraction] = {
    "fp32": Fraction(4),
    "float32": Fraction(4),
    "fp16": Fraction(2),
    "float16": Fraction(2),
    "bf16": Fraction(2),
    "bfloat16": Fraction(2),
    "fp8": Fraction(1),
    "fp8_e4m3": Fraction(1),
    "fp8_e5m2": Fraction(1),
    "int8": Fraction(1),
    "int4": Fraction(1, 2),
}

VALID_DTYPES: tuple[str, ...] = tuple(_DTYPE_BYTES)


def dtype_bytes(dtype: str) -> Fraction:
    """Bytes per element of a KV dtype name (case-insensitive); 0.5 for int4.

    Raises ValueError naming the valid dtypes when `dtype` is unknown.
    """
    if not isinstance(dtype, str):
        raise TypeError(f"dtype must be a string, got {type(dtype).__name__}")
    key = dtype.strip().lower()
    if key not in _DTYPE_BYTES:
        raise ValueError(f"unknown dtype {dtype!r}; valid dtypes: {', '.join(VALID_DTYPES)}")
    return _DTYPE_BYTES[key]


def _check_positive_int(name: str, value: object) -> int:
    """Return `value` if it is a positive int; TypeError for non-ints (bools included)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an integer, got {value!r}")
    if value <= 0:
        raise ValueError(f"{name} must be positive, got {value}")
    return value


def kv_cache_bytes(
    num_layers: int, num_kv_heads: int, head_dim: int, dtype: str, tokens: int = 1
) -> int:
    """Bytes of K and V for `tokens` tokens: 2 x layers x kv_heads x head_dim x bytes x tokens.

    All sizes must be positive ints (TypeError / ValueError otherwise); `dtype` is a name
    from VALID_DTYPES. The result is exact (int4 halves an even product, so it stays whole).
    """
    layers = _check_positive_int("num_layers", num_layers)
    kv_heads = _check_positive_int("num_kv_heads", num_kv_heads)
    dim = _check_positive_int("head_dim", head_dim)
    count = _check_positive_int("tokens", tokens)
    total = 2 * layers * kv_heads * dim * count * dtype_bytes(dtype)
    return int(total)


@dataclass(frozen=True)
class ModelShape:
    """The attention shape that decides KV size. Requires kv_heads to divide num_heads."""

    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    # Local attention: `sliding_layers` of the layers see only the last `window` tokens, so a
    # cache that lets go of what falls behind the window (the engine's hybrid KV cache)
    # keeps at most `window` tokens of them per request.
    sliding_layers: int = 0
    window: int | None = None

    def __post_init__(self) -> None:
        for field_name in ("num_layers", "num_heads", "num_kv_heads", "head_dim"):
            _check_positive_int(field_name, getattr(self, field_name))
        if self.num_kv_heads > self.num_heads or self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"num_kv_heads ({self.num_kv_heads}) must divide num_heads ({self.num_heads})"
            )
        sliding = self.sliding_layers
        if isinstance(sliding, bool) or not isinstance(sliding, int) or not (
                0 <= sliding <= self.num_layers):  # fmt: skip
            raise ValueError(f"sliding_layers must be an int in [0, num_layers], got {sliding!r}")
        if self.window is not None:
            _check_positive_int("window", self.window)
        if sliding and self.window is None:
            raise ValueError("sliding layers need a window")

    @property
    def attention_kind(self) -> str:
        """'MHA' (kv_heads == heads), 'MQA' (one kv head) or 'GQA' (in between)."""
        if self.num_kv_heads == self.num_heads:
            return "MHA"
        if self.num_kv_heads == 1:
            return "MQA"
        return "GQA"

    def bytes_per_token(self, dtype: str) -> int:
        """KV bytes one token occupies across all layers."""
        return kv_cache_bytes(self.num_layers, self.num_kv_heads, self.head_dim, dtype)

    def bytes_for_context(self, dtype: str, tokens: int) -> int:
        """KV bytes of one request of `tokens` tokens when the sliding layers keep only their
        window: full layers x tokens + sliding layers x min(tokens, window), per token-layer."""
        _check_positive_int("tokens", tokens)
        full = self.num_layers - self.sliding_layers
        kept = full * tokens + self.sliding_layers * min(tokens, self.window or tokens)
        return int(kept * 2 * self.num_kv_heads * self.head_dim * dtype_bytes(dtype))


MODEL_PRESETS: dict[str, ModelShape] = {
    "llama-70b": ModelShape(num_layers=80, num_heads=64, num_kv_heads=8, head_dim=128),
    "llama-8b": ModelShape(num_layers=32, num_heads=32, num_kv_heads=8, head_dim=128),
    "smollm2-135m": ModelShape(num_layers=30, num_heads=9, num_kv_heads=3, head_dim=64),
    "qwen2-7b": ModelShape(num_layers=28, num_heads=28, num_kv_heads=4, head_dim=128),
    "mistral-7b": ModelShape(num_layers=32, num_heads=32, num_kv_heads=8, head_dim=128),
    # Gemma 3: every 6th layer global, the others a 512 (1B) / 1,024 (27B) token window;
    # Gemma 2: every other layer slides over 4,096 tokens.
    "gemma3-1b": ModelShape(num_layers=26, num_heads=4, num_kv_heads=1, head_dim=256,
                            sliding_layers=22, window=512),
    "gemma3-27b": ModelShape(num_layers=62, num_heads=32, num_kv_heads=16, head_dim=128,
                             sliding_layers=52, window=1024),
    "gemma2-9b": ModelShape(num_layers=42, num_heads=16, num_kv_heads=8, head_dim=256,
                            sliding_layers=21, window=4096),
}


PRESET_ALIASES = {"smollm2": "smollm2-135m"}  # the engine's name for its default model


def model_preset(name: str) -> ModelShape:
    """The preset called `name` (case-insensitive; `smollm2` as the engine names it too);
    ValueError listing presets if unknown, TypeError if `name` is not a string."""
    if not isinstance(name, str):
        raise TypeError(f"model name must be a string, got {type(name).__name__}")
    key = name.strip().lower()
    shape = MODEL_PRESETS.get(PRESET_ALIASES.get(key, key))
    if shape is None:
        raise ValueError(f"unknown model {name!r}; presets: {', '.join(MODEL_PRESETS)}")
    return shape


class AttentionVariantSize(NamedTuple):
    """KV size of one attention variant of a model shape."""

    attention: str  # "MHA", "GQA" or "MQA"
    num_kv_heads: int
    bytes_per_token: int
    bytes_total: int  # bytes_per_token x tokens
    is_model: bool  # True for the row whose kv_heads is the model's own


def attention_variant_sizes(
    shape: ModelShape, dtype: str, tokens: int = 1
) -> list[AttentionVariantSize]:
    """Rows MHA (kv_heads = num_heads), GQA (the model's kv heads), MQA (1 kv head).

    Always three rows in that order, even when the model itself is MHA or MQA (then two
    rows coincide); `is_model` marks the GQA row, which carries the model's real kv heads.
    """
    rows = []
    for attention, kv_heads in (
        ("MHA", shape.num_heads),
        ("GQA", shape.num_kv_heads),
        ("MQA", 1),
    ):
        per_token = kv_cache_bytes(shape.num_layers, kv_heads, shape.head_dim, dtype)
        rows.append(
            AttentionVariantSize(
                attention=attention,
                num_kv_heads=kv_heads,
                bytes_per_token=per_token,
                bytes_total=per_token * _check_positive_int("tokens", tokens),
                is_model=attention == "GQA",
            )
        )
    return rows


_DECIMAL_UNITS = ("B", "kB", "MB", "GB", "TB", "PB")
_BINARY_UNITS = ("B", "KiB", "MiB", "GiB", "TiB", "PiB")


def _format_units(num_bytes: int, base: int, units: tuple[str, ...]) -> str:
    """`num_bytes` in the largest unit whose *shown* (rounded) value stays below `base`, so
    999_999 bytes read '1.00 MB', never '1000.00 kB'; plain bytes are shown whole."""
    if abs(num_bytes) < base:
        return f"{num_bytes} B"
    value = float(num_bytes)
    for unit in units[1:]:
        value /= base
        shown = f"{value:.2f}"
        if abs(float(shown)) < base or unit == units[-1]:
            return f"{shown} {unit}"
    raise AssertionError("unreachable")


def format_decimal_bytes(num_bytes: int) -> str:
    """SI units (1 GB = 10**9 bytes), two decimals: 1342177280 -> '1.34 GB'."""
    return _format_units(num_bytes, 1000, _DECIMAL_UNITS)


def format_binary_bytes(num_bytes: int) -> str:
    """IEC units (1 GiB = 2**30 bytes), two decimals: 1342177280 -> '1.25 GiB'."""
    return _format_units(num_bytes, 1024, _BINARY_UNITS)
