"""Turning what a caller passes as prompts into validated token id arrays."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

Prompt = str | Sequence[int]


def normalize_prompts(prompts: Any) -> list[Prompt]:
    """One prompt (a string or a list of token ids) or a list of them -> a list of prompts."""
    if isinstance(prompts, str):
        return [prompts]
    if isinstance(prompts, Sequence) and prompts and _are_token_ids(prompts):
        return [list(prompts)]
    if isinstance(prompts, Sequence) and not isinstance(prompts, (bytes, bytearray)):
        if not prompts:
            raise ValueError("no prompts given")
        for prompt in prompts:
            if not isinstance(prompt, str) and not (
                isinstance(prompt, Sequence) and _are_token_ids(prompt)
            ):
                raise TypeError(
                    "each prompt must be a string or a list of int token ids, got "
                    f"{type(prompt).__name__}"
                )
        return list(prompts)
    raise TypeError(f"prompts must be a string, token ids or a list of them, got {type(prompts)}")


def single_prompt(prompt: Any) -> Prompt:
    """``prompt`` if it is one prompt (a string or a list of int token ids; an empty list is an
    empty prompt), else TypeError: where one prompt is expected, a list of them is refused
    rather than cut to its first."""
    if isinstance(prompt, str):
        return prompt
    if (isinstance(prompt, Sequence) and not isinstance(prompt, (bytes, bytearray))
            and _are_token_ids(prompt)):
        return list(prompt)
    raise TypeError(f"a prompt must be a string or a list of int token ids, got {prompt!r:.60}")


def to_token_ids(
    prompt: Prompt,
    encode: Callable[[str], list[int]],
    vocab_size: int,
    max_model_len: int,
) -> np.ndarray:  # [num_tokens] int32
    """Encode a text prompt (or check a token prompt, whose elements ``normalize_prompts``
    found to be ints): non-empty, ids in the vocabulary, and at most ``max_model_len - 1``
    tokens so at least one token can be generated. One conversion to an array, checked by
    numpy: a long prompt costs a pass in C, not one per check."""
    try:
        token_ids = np.asarray(encode(prompt) if isinstance(prompt, str) else prompt, np.int64)
    except OverflowError:
        raise ValueError("a token id does not fit in 64 bits") from None
    if not token_ids.size:
        raise ValueError("the prompt is empty")
    low, high = int(token_ids.min()), int(token_ids.max())
    if low < 0 or high >= vocab_size:
        bad = low if low < 0 else high
        raise ValueError(f"token id {bad} is outside the vocabulary [0, {vocab_size})")
    if len(token_ids) >= max_model_len:
        raise ValueError(
            f"the prompt has {len(token_ids)} tokens; max_model_len is {max_model_len} "
            "(the prompt plus at least one generated token must fit)"
        )
    return token_ids.astype(np.int32)


def _are_token_ids(values: Sequence[object]) -> bool:
    """Every value an int (bool excluded); checked per distinct type, so a long prompt costs
    one pass in C."""
    kinds = set(map(type, values))
    return all(issubclass(kind, int) and not issubclass(kind, bool) for kind in kinds)
