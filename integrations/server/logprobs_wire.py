"""Sampled tokens' log probabilities (``TokenLogprob``) in OpenAI's two shapes: chat's
``{"content": [{"token", "logprob", "bytes", "top_logprobs"}]}`` and the completions API's
``{"tokens", "token_logprobs", "top_logprobs", "text_offset"}``. A token's text is its bytes
read as UTF-8 (a token holding part of a character shows U+FFFD; ``bytes`` is exact)."""

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
                        text_offset: int = 0) -> p.CompletionLogprobs:
    """``text_offset``: where the first of ``entries`` starts in the choice's text."""
    result = p.CompletionLogprobs()
    offset = text_offset
    for entry in entries:
        text, _ = _text(tokenizer, entry.token_id)
        result.tokens.append(text)
        result.token_logprobs.append(entry.logprob)
        result.top_logprobs.append({_text(tokenizer, t)[0]: lp for t, lp in entry.top})
        result.text_offset.append(offset)
        offset += len(text)
    return result
