"""Checks of the engine's constructor options, run before any weight is loaded.

Each check raises TypeError for a value of the wrong type and ValueError for one out of range,
and names the option, so a bad setting fails up front instead of dropping every request later.
"""

from __future__ import annotations

import torch
from pydantic import ByteSize, TypeAdapter, ValidationError

# The compute dtypes the model runs in, by name (names are matched case-insensitively).
SUPPORTED_DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float16": torch.float16,
    "fp16": torch.float16,
}
# One prompt token plus one generated token: the shortest context a request can use.
MIN_MODEL_LEN = 2


def check_int_option(name: str, value: object, minimum: int = 1) -> int:
    """``value`` if it is an int >= ``minimum`` (bools are not ints here)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    return value


def check_optional_int_option(name: str, value: object, minimum: int = 1) -> int | None:
    """None (meaning: the default) or an int >= ``minimum``."""
    return None if value is None else check_int_option(name, value, minimum)


def check_bool_option(name: str, value: object) -> bool:
    """``value`` if it is a bool (a string such as "no" would otherwise count as true)."""
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be True or False, got {type(value).__name__} {value!r}")
    return value


def check_kv_pool_size(num_blocks: object, kv_cache_memory: object) -> None:
    """At most one of ``num_blocks`` / ``kv_cache_memory`` (bytes), each a positive int."""
    check_optional_int_option("num_blocks", num_blocks)
    check_optional_int_option("kv_cache_memory", kv_cache_memory)
    if num_blocks is not None and kv_cache_memory is not None:
        raise ValueError(
            "num_blocks and kv_cache_memory both size the KV pool: give one of them, not both"
        )


def parse_memory_size(name: str, value: object) -> int | None:
    """None, or a byte count given as an int >= 1 or a string such as ``"8GiB"``, ``"512MB"``
    (pydantic's ``ByteSize``: IEC and SI units); ValueError / TypeError naming ``name``."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise TypeError(f"{name} must be a number of bytes or a size such as '8GiB', "
                        f"got {type(value).__name__}")  # fmt: skip
    try:
        size = int(TypeAdapter(ByteSize).validate_python(value))
    except ValidationError as error:
        raise ValueError(f"{name}={value!r} is not a size such as 8GiB or 512MB") from error
    if size < 1:
        raise ValueError(f"{name} must be at least 1 byte, got {value!r}")
    return size


def resolve_dtype(dtype: object) -> torch.dtype | None:
    """None (the device's default) or one of the supported compute dtypes, given as a
    ``torch.dtype`` or a name from ``SUPPORTED_DTYPES`` (any case, e.g. "BF16")."""
    if dtype is None:
        return None
    choices = sorted(SUPPORTED_DTYPES)
    if isinstance(dtype, torch.dtype):
        if dtype not in SUPPORTED_DTYPES.values():
            raise ValueError(f"dtype {dtype} is not supported; choose from {choices}")
        return dtype
    if not isinstance(dtype, str):
        raise TypeError(f"dtype must be a torch.dtype or a str, got {type(dtype).__name__}")
    key = dtype.strip().lower()
    if key not in SUPPORTED_DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}; choose from {choices}")
    return SUPPORTED_DTYPES[key]
