"""The server's limits on one request, with defaults sized from the model.

A request's cost to the event loop is the JSON it sends (parsed and validated on the loop,
in C code that holds the GIL throughout) plus the prompts it asks to tokenize and queue. So
each request is capped three ways, every cap a 4xx naming it:

* ``max_prompts``: prompts in one ``/v1/completions`` request (400 ``too_many_prompts``);
* ``max_prompt_tokens``: prompt tokens of one request, all its prompts together (400
  ``too_many_prompt_tokens``); by default ``PROMPT_TOKENS_CONTEXTS`` full contexts, at most
  ``MAX_DEFAULT_PROMPT_TOKENS`` unless one context is longer;
* ``max_body_bytes``: the body (413 ``request_too_large``), by default ``BODY_BYTES_PER_TOKEN``
  bytes per allowed prompt token: generous for any natural text or token-id list in JSON
  (English about 5 bytes a token, CJK escaped as ``\\uXXXX`` about 9, ids at most 7), so a
  body that could fit the token cap is read, and one far beyond it is refused unread. Text
  whose every byte is an escaped control character could outgrow it while fitting the token
  cap; such a request needs a larger ``max_body_bytes``.

Measured (2-core Zen 4, ``benchmarks/request_parse.py``-style timings of json.loads plus
validation): the worst 4 MiB body (2 M token ids, or 140 K one-letter chat messages) holds
the loop about 0.1 s; the 60 MiB the earlier default allowed held it 2.3 s.
"""

from __future__ import annotations

from dataclasses import dataclass

DEFAULT_MAX_PROMPTS = 256
PROMPT_TOKENS_CONTEXTS = 16  # default prompt-token cap: this many full contexts...
MAX_DEFAULT_PROMPT_TOKENS = 1 << 17  # ...but no more than this, unless one context is longer
BODY_BYTES_PER_TOKEN = 32
MIN_BODY_BYTES = 1 << 20  # never below 1 MiB (chat templates, tool schemas)


def default_max_prompt_tokens(max_model_len: int) -> int:
    """``PROMPT_TOKENS_CONTEXTS`` full contexts, at most ``MAX_DEFAULT_PROMPT_TOKENS``, never
    less than one context (a prompt that fits the model always fits the request)."""
    return max(max_model_len, min(PROMPT_TOKENS_CONTEXTS * max_model_len,
                                  MAX_DEFAULT_PROMPT_TOKENS))


def default_max_body_bytes(max_prompt_tokens: int) -> int:
    """``BODY_BYTES_PER_TOKEN`` bytes per allowed prompt token, at least ``MIN_BODY_BYTES``."""
    return max(MIN_BODY_BYTES, BODY_BYTES_PER_TOKEN * max_prompt_tokens)


@dataclass(frozen=True)
class RequestLimits:
    """What one request may ask of the server (module docstring); every field positive."""

    max_prompts: int
    max_prompt_tokens: int
    max_body_bytes: int

    def __post_init__(self) -> None:
        for name in ("max_prompts", "max_prompt_tokens", "max_body_bytes"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an int >= 1, got {value!r}")

    @classmethod
    def for_model(cls, max_model_len: int, *, max_prompts: int | None = None,
                  max_prompt_tokens: int | None = None,
                  max_body_bytes: int | None = None) -> RequestLimits:
        """The limits for a model of ``max_model_len``; None takes each default."""
        if max_prompt_tokens is None:
            max_prompt_tokens = default_max_prompt_tokens(max_model_len)
        return cls(
            max_prompts=DEFAULT_MAX_PROMPTS if max_prompts is None else max_prompts,
            max_prompt_tokens=max_prompt_tokens,
            max_body_bytes=(default_max_body_bytes(max_prompt_tokens) if max_body_bytes is None
                            else max_body_bytes),
        )
