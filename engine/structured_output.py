"""Structured outputs: what a request's output must match (``StructuredOutput``), compiled by
llguidance into a token-level matcher whose masks the sampler applies.

llguidance was chosen over xgrammar by measurement on SmolLM2's 49,152-token vocabulary (2-core
AMD EPYC Zen 4): a tool-call JSON schema compiles in 0.5-0.9 ms (xgrammar 6.3-6.6 ms), a mask
costs 0.03-0.11 ms a token (xgrammar 0.18-0.19 ms), the tokenizer is read once in ~0.2 s
(xgrammar 0.23-0.25 s), and it needs neither transformers nor a compiler at run time. Its
"slicer" (the default) matters: inside a JSON string, where nearly every token is allowed, a
mask took 0.49 ms without it and 0.03 ms with it. Its ``llguidance.torch`` helper is not used:
it applies masks through ``torch.compile`` (2 s at the first call); ``apply_grammar_masks``
unpacks the bits with numpy instead.

A matcher is one request's state: it consumes each sampled token, is copied when the request
forks (``n > 1``) and survives preemption (it lives on the request, whose sampled tokens are
kept). Compiled grammars are cached by their spec.
"""

from __future__ import annotations

import functools
import json
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from prefixcache.engine.grammar_defaults import JSON_OPTIONS

GRAMMAR_CACHE_SIZE = 256  # compiled grammars kept, least recently used dropped first


class StructuredOutputError(ValueError):
    """A spec the grammar library refuses (a bad schema, regex or grammar); the message
    says why."""


@dataclass(frozen=True)
class StructuredOutput:
    """Exactly one of: ``json`` (a JSON Schema, as a dict or its JSON text), ``json_object``
    (any JSON object), ``regex``, ``choice`` (one of these strings) or ``grammar`` (a Lark
    grammar in llguidance's dialect, which may embed JSON schemas as ``%json {...}``)."""

    json: dict[str, Any] | str | None = None
    json_object: bool = False
    regex: str | None = None
    choice: tuple[str, ...] | None = None
    grammar: str | None = None

    def __post_init__(self) -> None:
        given = [name for name in ("json", "regex", "choice", "grammar")
                 if getattr(self, name) is not None] + (["json_object"] if self.json_object
                                                        else [])  # fmt: skip
        if len(given) != 1:
            raise ValueError(f"a structured output takes exactly one of json, json_object, "
                             f"regex, choice, grammar; got {given or 'none'}")  # fmt: skip
        if self.json is not None and not isinstance(self.json, (dict, str)):
            raise TypeError(f"json must be a JSON Schema (a dict or its text), got "
                            f"{type(self.json).__name__}")  # fmt: skip
        for name in ("regex", "grammar"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str) or not value):
                raise TypeError(f"{name} must be a non-empty string")
        if self.choice is not None:
            choices = tuple(self.choice)
            if not choices or not all(isinstance(c, str) and c for c in choices):
                raise TypeError("choice must be a non-empty list of non-empty strings")
            object.__setattr__(self, "choice", choices)

    @property
    def key(self) -> str:
        """A canonical text of the spec (the grammar cache's key)."""
        spec = json.loads(self.json) if isinstance(self.json, str) else self.json
        return json.dumps([spec, self.json_object, self.regex, self.choice, self.grammar],
                          sort_keys=True)  # fmt: skip

    def lark_or_grammar(self) -> str:
        """The llguidance grammar (its JSON form) of this spec; may raise ValueError for JSON
        that is not a JSON object."""
        import llguidance

        matcher = llguidance.LLMatcher
        if self.json is not None:
            return matcher.grammar_from_json_schema(self.json, defaults=JSON_OPTIONS)
        if self.json_object:
            return matcher.grammar_from_json_schema({"type": "object"}, defaults=JSON_OPTIONS)
        if self.regex is not None:
            return matcher.grammar_from_regex(self.regex)
        if self.choice is not None:
            alternatives = " | ".join(json.dumps(c) for c in self.choice)
            return matcher.grammar_from_lark(f"start: {alternatives}")
        assert self.grammar is not None
        return matcher.grammar_from_lark(self.grammar)


class GrammarCompiler:
    """Compiles ``StructuredOutput``s for one model's tokenizer (``tokenizer_json()`` gives the
    tokenizers library's JSON of it, asked for at the first compile) over ``vocab_size``
    logits; thread-safe."""

    def __init__(self, tokenizer_json: Callable[[], str], vocab_size: int,
                 eos_token_ids: Sequence[int]) -> None:  # fmt: skip
        self._tokenizer_json = tokenizer_json
        self.vocab_size = vocab_size
        self.eos_token_ids = list(eos_token_ids)
        self._tokenizer: Any = None  # llguidance.LLTokenizer, read at the first compile
        self._grammars: OrderedDict[str, str] = OrderedDict()
        self._lock = threading.Lock()
        self.compiled = 0  # grammars compiled (cache misses)

    def matcher(self, spec: StructuredOutput) -> Any:  # llguidance.LLMatcher
        """A fresh matcher of ``spec``, at its start; StructuredOutputError when the grammar
        library refuses the spec."""
        import llguidance

        grammar = self._grammar(spec)
        return llguidance.LLMatcher(self._llg_tokenizer(), grammar, log_level=0)

    def check(self, spec: StructuredOutput) -> None:
        """StructuredOutputError when the grammar library refuses ``spec`` (compiles it and
        caches it otherwise)."""
        self._grammar(spec)

    def _grammar(self, spec: StructuredOutput) -> str:
        import llguidance

        key = spec.key
        with self._lock:
            if key in self._grammars:
                self._grammars.move_to_end(key)
                return self._grammars[key]
        try:
            grammar = spec.lark_or_grammar()
        except ValueError as error:
            raise StructuredOutputError(str(error)) from error
        problem = llguidance.LLMatcher.validate_grammar(grammar, self._llg_tokenizer())
        if problem:
            raise StructuredOutputError(problem)
        with self._lock:
            self.compiled += 1
            self._grammars[key] = grammar
            while len(self._grammars) > GRAMMAR_CACHE_SIZE:
                self._grammars.popitem(last=False)
        return grammar

    def _llg_tokenizer(self) -> Any:
        import llguidance

        with self._lock:
            if self._tokenizer is None:
                self._tokenizer = llguidance.LLTokenizer(
                    self._tokenizer_json(), n_vocab=self.vocab_size,
                    eos_token=self.eos_token_ids or None,
                )  # fmt: skip
            return self._tokenizer


class GrammarMasks:
    """What a step's constrained rows may sample next. A sampling row needs its whole mask:
    those are computed on a thread of their own while the model runs the step (llguidance
    releases the GIL), started when this is built, before the forward. A greedy row needs
    only to know whether its argmax is allowed — if it is, it is the argmax of the allowed
    tokens too (ties included: the lowest id wins both) — so its matcher is asked about that
    one token, and a mask is computed only when the answer is no. Inside a JSON string, where
    nearly every token is allowed, a greedy row then costs one token check instead of a mask.

    ``rows``: ``(row in the step's logits, matcher, greedy)``."""

    def __init__(self, rows: Sequence[tuple[int, Any, bool]], vocab: int) -> None:
        self.words = (vocab + 31) // 32
        self.vocab = vocab
        self.sampled = [(row, matcher) for row, matcher, greedy in rows if not greedy]
        self.greedy = [(row, matcher) for row, matcher, greedy in rows if greedy]
        self._future = _mask_thread().submit(
            _fill_masks, [m for _, m in self.sampled], self.words) if self.sampled else None

    def apply(self, logits: torch.Tensor) -> None:  # [rows, vocab] float32, in place
        """Set to -inf every token a row's matcher does not allow next, where it matters (a
        matcher in an error state allows nothing: the row's sampler then falls back to its
        argmax)."""
        masked = list(self.sampled)
        bitmask = self._future.result() if self._future is not None else \
            np.zeros((0, self.words), dtype=np.int32)  # fmt: skip
        if self.greedy:
            top = logits[[row for row, _ in self.greedy]].argmax(dim=-1).tolist()
            refused = [(row, matcher) for (row, matcher), token in zip(self.greedy, top,
                                                                        strict=True)
                       if matcher.is_error() or matcher.validate_tokens([token]) != 1]
            if refused:
                masked += refused
                bitmask = np.concatenate([bitmask, _fill_masks([m for _, m in refused],
                                                               self.words)])  # fmt: skip
        if not masked:
            return
        # the bits of the inverted mask, one byte each, read as bools: one pass
        bits = np.unpackbits(~bitmask.view(np.uint8), axis=1, bitorder="little")
        blocked = torch.from_numpy(bits[:, : self.vocab]).view(torch.bool)  # [n, vocab]
        rows = [row for row, _ in masked]
        if rows == list(range(logits.shape[0])):  # every row: in place
            logits.masked_fill_(blocked, float("-inf"))
        else:
            index = torch.tensor(rows)
            logits[index] = logits[index].masked_fill_(blocked, float("-inf"))


def _fill_masks(matchers: Sequence[Any], words: int) -> np.ndarray:  # [n, words] int32
    bitmask = np.zeros((len(matchers), words), dtype=np.int32)
    for i, matcher in enumerate(matchers):
        if not matcher.is_error():
            matcher.unsafe_compute_mask_ptr(bitmask[i].ctypes.data, words * 4)
    return bitmask


@functools.lru_cache(maxsize=1)
def _mask_thread() -> ThreadPoolExecutor:
    return ThreadPoolExecutor(1, thread_name_prefix="grammar-masks")
