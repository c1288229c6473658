"""Deciding when a sequence is done, and keeping its text (stop strings cut) up to date."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from prefixcache.engine.request import Request
from prefixcache.engine.sampling_params import SamplingParams


class SequenceText:
    """The decoded output of one sequence; decodes lazily and only what is needed.

    ``text`` is always ``decode(output ids)``, with a trailing incomplete UTF-8 character
    held back while the sequence runs. With ``prefix_stable`` (a decoder for which decoding
    ids[:s], when that ends on a complete character, then ids[s:], gives the decoding of all
    ids: byte-level BPE, see ``Tokenizer.decode_concatenates``) each update decodes only the
    ids since the last complete character, so keeping a streamed sequence's text costs the
    new tokens, not its whole output; otherwise every update decodes the whole output.
    """

    def __init__(self, decode: Callable[[list[int]], str], prefix_stable: bool = False) -> None:
        self._decode = decode
        self._prefix_stable = prefix_stable
        self._settled_text = ""  # decode of the first _settled ids, ending on a complete char
        self._settled = 0
        self._updated_for: tuple[int, bool] | None = None  # (num_tokens, finished) of `text`
        self.text = ""

    def update(self, request: Request) -> str:
        """Bring ``text`` up to the request's output ids and return it (a step that checks
        stop strings and then streams asks twice; the second call decodes nothing)."""
        state = (request.num_tokens, request.is_finished)
        if state == self._updated_for:
            return self.text
        self._updated_for = state
        start = request.num_prompt_tokens + self._settled
        tail = self._decode(request.tokens[start : request.num_tokens].tolist())
        incomplete = tail.endswith("\ufffd")
        if self._prefix_stable and tail and not incomplete:
            self._settled_text += tail
            self._settled = request.num_tokens - request.num_prompt_tokens
            tail = ""
        if incomplete and not request.is_finished:
            tail = tail[:-1]
        self.text = self._settled_text + tail
        return self.text

    def search_start(self, previous_length: int, needle_length: int) -> int:
        """Where a search for a string of ``needle_length`` characters must start so as to
        find every occurrence that ends past ``previous_length`` characters of ``text``
        (what an earlier update returned): text only grows at its end when it is prefix
        stable, so earlier occurrences were seen before; otherwise anywhere (0)."""
        if not self._prefix_stable:
            return 0
        return max(0, previous_length - needle_length + 1)


def stop_string_holdback(params: SamplingParams) -> int:
    """How many trailing characters of a running sequence's text are not handed out yet:
    one less than the longest stop string, which could still complete there and be cut
    (none when stop strings are kept in the output), so the text a stream has sent is
    always a prefix of the final text."""
    if params.include_stop_str_in_output or not params.stop:
        return 0
    return max(len(stop) for stop in params.stop) - 1


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
    if request.num_output_tokens < params.min_tokens:  # too early for a stop (as vLLM)
        return "length" if request.num_tokens >= max_model_len else None
    if not params.ignore_eos and token in eos_token_ids:
        request.stop_reason = None
        return "stop"
    if token in params.stop_token_ids:
        request.stop_reason = token
        return "stop"
    if params.stop:
        searched = len(text.text)  # what earlier steps' searches covered
        current = text.update(request)
        for stop in params.stop:
            found = current.find(stop, text.search_start(searched, len(stop)))
            if found >= 0:
                end = found + len(stop) if params.include_stop_str_in_output else found
                text.text = current[:end]
                request.stop_reason = stop
                return "stop"
    if request.num_output_tokens >= params.max_tokens or request.num_tokens >= max_model_len:
        return "length"
    return None
