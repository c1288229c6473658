"""An OpenAI request body as the router reads it: parsed once with simdjson, a prompt of token
ids going straight into an int64 array (a 32K-token prompt: ~0.35 ms for the whole body,
against ~1.3 ms for msgspec's Python list of ints and its conversion to an array).

The router only reads the body to route it; the bytes it forwards are the client's own.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import simdjson


class BodyParser:
    """``parse(raw)``: the body's top-level value as Python objects, except that an object's
    ``prompt`` holding a flat list of integers is an int64 array ``[tokens]``; None when
    ``raw`` is not JSON. One parser per event loop (a parse reuses its buffers)."""

    def __init__(self) -> None:
        self._parser = simdjson.Parser()

    def parse(self, raw: bytes) -> Any:
        try:
            document = self._parser.parse(raw)
        except (ValueError, TypeError):  # malformed JSON, or not UTF-8
            return None
        if not isinstance(document, simdjson.Object):
            return _python(document)
        body = {}
        for key in document:
            value = document[key]
            body[key] = _token_ids(value) if key == "prompt" else _python(value)
        return body


def _token_ids(value: Any) -> Any:  # an int64 array [tokens], or the value as Python objects
    if isinstance(value, simdjson.Array):
        try:  # as_buffer flattens nested lists: a batch of prompts must stay a list
            ids = np.frombuffer(value.as_buffer(of_type="i"), dtype=np.int64)
        except (ValueError, TypeError, OverflowError):  # not integers only
            ids = None
        if ids is not None and len(ids) == len(value) and not (
            len(ids) and isinstance(value[0], simdjson.Array)
        ):
            return ids
    return _python(value)


def _python(value: Any) -> Any:
    if isinstance(value, simdjson.Object):
        return value.as_dict()
    if isinstance(value, simdjson.Array):
        return value.as_list()
    return value
