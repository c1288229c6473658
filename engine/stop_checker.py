"""Deciding when a sequence is done, and keeping its text (stop strings cut) up to date."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from prefixcache.engine.request import Request


class SequenceText:
    """The decoded output of one sequence; decodes lazily and only what is needed."""

    def __init__(self, decode: Callable[[list[int]], str]) -> None:
        self._decode = decode
        self.text = ""

    def update(self, request: Request) -> str:
        """Re-decode the output ids; a trailing incomplete UTF-8 character is held back."""
        text = self._decode(request.output_token_ids)
        self.text = text[:-1] if text.endswith("\ufffd") and not request.is_finished else text
        return self.text


def check_stop(
    request: Request,
    text: SequenceText,
    eos_token_ids: Sequence[int],
    max_model_len: int,
) -> str | None:
    """Return the finish reason ("stop" / "length") after the newest token, or None.

    On a stop string the text is cut before it (kept with ``include_stop_str_in_output``).
    """
    params = request.params
    token = int(request.tokens[request.num_tokens - 1])
    if not params.ignore_eos and token in eos_token_ids:
        request.stop_reason = None
        return "stop"
    if token in params.stop_token_ids:
        request.stop_reason = token
        return "stop"
    if params.stop:
        current = text.update(request)
        for stop in params.stop:
            found = current.find(stop)
            if found >= 0:
                end = found + len(stop) if params.include_stop_str_in_output else found
                text.text = current[:end]
                request.stop_reason = stop
                return "stop"
    if request.num_output_tokens >= params.max_tokens or request.num_tokens >= max_model_len:
        return "length"
    return None
