"""Sampled tokens' log probabilities (``TokenLogprob``) in OpenAI's two shapes: chat's
``{"content": [{"token", "logprob", "bytes", "top_logprobs"}]}`` and the completions API's
``{"tokens", "token_logprobs", "top_logprobs", "text_offset"}``. A token's text is its bytes
read as UTF-8 (a token holding part of a character shows U+FFFD; ``bytes`` is exact).
Prompt tokens' (``echo`` with ``logprobs``, vLLM's ``prompt_logprobs``) have None first: no
token precedes the first."""

from __future__ import annotations

from collections.abc import Sequence

from prefixcache.engine.outputs import TokenLogprob
from prefixcache.engine.tokenizer import Tokenizer
from prefixcache.integrations.server import protocol as p


def _text(tokenizer: Tokenizer, token_id: int) -> tuple[str, bytes]:
    raw = tokenizer.token_bytes(token_id)
    return raw.decode("utf-8", errors="replace"), raw


def chat_logprobs(tokenizer: Tokenizer, entries: Sequence[TokenLogprob]) -> p.ChoiceLogprobs:
    content = []
    for entry in entries:
        text, raw = _text(tokenizer, entry.token_id)
        top = []
        for token_id, logprob in entry.top:
            top_text, top_raw = _text(tokenizer, token_id)
            top.append(p.TopLogprob(token=top_text, logprob=logprob, bytes=list(top_raw)))
        content.append(p.TokenLogprobEntry(token=text, logprob=entry.logprob, bytes=list(raw),
                                           top_logprobs=top))  # fmt: skip
    return p.ChoiceLogprobs(content=content)


def completion_logprobs(tokenizer: Tokenizer, entries: Sequence[TokenLogprob],
                        text_offset: int = 0,
                        echoed: tuple[Sequence[int], Sequence[TokenLogprob | None]] | None = None,
                        ) -> p.CompletionLogprobs:  # fmt: skip
    """``text_offset``: where the first of ``entries`` starts in the choice's text. ``echoed``
    (the prompt's ids and ``prompt_logprobs`` entries) come first, from offset 0, with a null
    log probability for the first prompt token."""
    result = p.CompletionLogprobs()
    offset = 0 if echoed else text_offset
    rows: list[tuple[int, TokenLogprob | None]] = []
    if echoed:
        rows += list(zip(echoed[0], echoed[1], strict=True))
    rows += [(entry.token_id, entry) for entry in entries]
    for index, (token_id, entry) in enumerate(rows):
        if echoed and index == len(echoed[0]):
            offset = max(offset, text_offset)  # the generated text starts after the echo
        text, _ = _text(tokenizer, token_id)
        result.tokens.append(text)
        result.token_logprobs.append(None if entry is None else entry.logprob)
        result.top_logprobs.append(
            None if entry is None else {_text(tokenizer, t)[0]: lp for t, lp in entry.top})
        result.text_offset.append(offset)
        offset += len(text)
    return result


def prompt_logprobs_wire(tokenizer: Tokenizer,
                         entries: Sequence[TokenLogprob | None]) -> p.PromptLogprobs:
    """vLLM's ``prompt_logprobs``: per position the prompt's token and the top ones, by id."""
    wire: p.PromptLogprobs = []
    for entry in entries:
        if entry is None:
            wire.append(None)
            continue
        position = {str(token_id): p.PromptLogprob(logprob=logprob, rank=rank,
                                                   decoded_token=_text(tokenizer, token_id)[0])
                    for rank, (token_id, logprob) in enumerate(entry.top, start=1)}  # fmt: skip
        position[str(entry.token_id)] = p.PromptLogprob(
            logprob=entry.logprob, rank=entry.rank,
            decoded_token=_text(tokenizer, entry.token_id)[0])
        wire.append(position)
    return wire
