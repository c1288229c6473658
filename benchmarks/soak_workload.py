"""The soak test's request mix: a seeded, deterministic list of HTTP requests for the server.

Each ``Case`` is one request and what the client does with it: read it whole, stream it to the
end, or leave early (close a stream after a few chunks, give up on a whole response after a
moment). The mix covers completions and chat, streamed or not, ``n`` > 1, several prompts in
one request, prompts sharing long prefixes (documents, some under a tenant's cache salt), long
unique prompts, and bad inputs (malformed JSON, wrong types, an unknown model, prompts over the
context length, token ids outside the vocabulary, out-of-range ``n`` and ``max_tokens``).
``max_tokens`` stays small (1-4; 6 where the client leaves): the soak is about what each
request leaves behind, not about decoding.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

_WORDS_TEXT = (
    "the cache keeps attention keys and values of every prompt prefix so a repeated system "
    "prompt document or tool schema is never computed twice river stone garden lamp window "
    "engine request token block radix tree memory page thread queue stream client server "
    "model answer question summary report city mountain ocean forest paper pencil music"
)
WORDS = tuple(_WORDS_TEXT.split())
TENANTS = tuple(f"tenant-{i}" for i in range(4))

# kind -> weight; the kinds a client leaves early ("*_leave") add up to about a third.
MIX: dict[str, float] = {
    "completion": 12,
    "chat": 8,
    "stream": 10,
    "stream_chat": 6,
    "stream_leave": 18,
    "stream_chat_leave": 6,
    "whole_leave": 8,
    "n_many": 6,
    "stream_n_many": 4,
    "multi_prompt": 4,
    "long_unique": 0.6,
    "metrics": 1,
    "bad_json": 2,
    "bad_type": 2,
    "bad_model": 2,
    "over_context": 4,
    "bad_token_ids": 2,
    "bad_n": 1,
    "bad_max_tokens": 1,
    "empty_messages": 1,
}


@dataclass(frozen=True)
class Case:
    """One request of the soak.

    ``body``: a JSON-able dict, or raw bytes sent as ``application/json`` (malformed on
    purpose). ``leave_after``: for a stream, the chunks read before the client closes the
    connection; for a whole response, the seconds the client waits before giving up (None:
    the client reads the response to its end). ``expect``: the status codes that are right."""

    kind: str
    method: str
    path: str
    body: dict | bytes | None = None
    stream: bool = False
    leave_after: float | None = None
    expect: tuple[int, ...] = (200,)


def _text(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(words))


class Workload:
    """Seeded cases for a server whose context is ``max_model_len`` tokens and whose model
    has ``vocab_size`` token ids; the same seed gives the same cases in the same order."""

    def __init__(self, seed: int, model: str, max_model_len: int, vocab_size: int,
                 long_words: tuple[int, int] = (1200, 2400)) -> None:
        self.model = model
        self.max_model_len = max_model_len
        self.vocab_size = vocab_size
        self.long_words = long_words
        self._rng = random.Random(seed)
        # Long shared prefixes: a few documents (some 300-600 words), resent with a different
        # question every time, as a RAG pipeline or an agent's system prompt does.
        self.documents = [_text(self._rng, self._rng.randint(300, 600)) for _ in range(4)]
        self._kinds = list(MIX)
        self._weights = [MIX[k] for k in self._kinds]

    def cases(self, count: int) -> list[Case]:
        """The first ``count`` cases."""
        return [self._case(self._rng.choices(self._kinds, self._weights)[0])
                for _ in range(count)]

    # ------------------------------------------------------------------ prompts
    def _prompt(self) -> str:
        """A short question, half of the time after a tenant's long shared document."""
        rng = self._rng
        question = f"Question {rng.randrange(10**6)}: {_text(rng, rng.randint(4, 24))}?"
        if rng.random() < 0.5:
            return f"{rng.choice(self.documents)}\n\n{question}"
        return question

    def _messages(self) -> list[dict]:
        rng = self._rng
        messages = [{"role": "system", "content": rng.choice(self.documents)}] \
            if rng.random() < 0.5 else []
        for _ in range(rng.randint(0, 2)):  # some earlier turns
            messages += [{"role": "user", "content": _text(rng, rng.randint(3, 12))},
                         {"role": "assistant", "content": _text(rng, rng.randint(3, 12))}]
        return [*messages, {"role": "user", "content": _text(rng, rng.randint(4, 24))}]

    def _sampling(self, body: dict) -> dict:
        """Small ``max_tokens``; greedy or seeded sampling; a tenant's salt now and then."""
        rng = self._rng
        body = {"model": self.model, "max_tokens": rng.randint(1, 4), **body}
        if rng.random() < 0.5:
            body.update(temperature=0.8, top_p=0.95, seed=rng.randrange(1 << 30))
        else:
            body["temperature"] = 0.0
        if rng.random() < 0.1:
            body["cache_salt"] = rng.choice(TENANTS)
        if rng.random() < 0.1:
            body["stop"] = [rng.choice(WORDS)]
        return body

    # ------------------------------------------------------------------ cases
    def _case(self, kind: str) -> Case:
        rng = self._rng
        completions, chat = "/v1/completions", "/v1/chat/completions"
        if kind == "completion":
            return Case(kind, "POST", completions, self._sampling({"prompt": self._prompt()}))
        if kind == "chat":
            return Case(kind, "POST", chat, self._sampling({"messages": self._messages()}))
        if kind in ("stream", "stream_leave", "stream_n_many"):
            body = self._sampling({"prompt": self._prompt(), "stream": True})
            if kind == "stream_n_many":
                body.update(n=rng.randint(2, 4), temperature=0.8)
            if rng.random() < 0.5:
                body["stream_options"] = {"include_usage": True}
            if kind == "stream_leave":
                body.update(max_tokens=6, ignore_eos=True)
                return Case(kind, "POST", completions, body, stream=True,
                            leave_after=rng.randint(1, 3))
            return Case(kind, "POST", completions, body, stream=True)
        if kind in ("stream_chat", "stream_chat_leave"):
            body = self._sampling({"messages": self._messages(), "stream": True})
            if kind == "stream_chat_leave":
                body.update(max_tokens=6, ignore_eos=True)
                return Case(kind, "POST", chat, body, stream=True, leave_after=rng.randint(1, 3))
            return Case(kind, "POST", chat, body, stream=True)
        if kind == "whole_leave":  # long enough to be still running when the client gives up
            body = self._sampling({"prompt": self._prompt(), "max_tokens": 6,
                                   "ignore_eos": True})
            return Case(kind, "POST", completions, body, leave_after=rng.uniform(0.05, 0.5))
        if kind == "n_many":
            path = rng.choice((completions, chat))
            key, value = (("prompt", self._prompt()) if path == completions
                          else ("messages", self._messages()))
            body = self._sampling({key: value})
            body.update(n=rng.randint(2, 4), temperature=0.8)
            return Case(kind, "POST", path, body)
        if kind == "multi_prompt":
            prompts = [self._prompt() for _ in range(rng.randint(2, 3))]
            return Case(kind, "POST", completions, self._sampling({"prompt": prompts}),
                        stream=rng.random() < 0.5)
        if kind == "long_unique":
            body = self._sampling({"prompt": _text(rng, rng.randint(*self.long_words))})
            return Case(kind, "POST", completions, body)
        if kind == "metrics":
            return Case(kind, "GET", "/metrics")
        return self._bad(kind)

    def _bad(self, kind: str) -> Case:
        """A request the server must refuse with a 4xx (and nothing left behind)."""
        rng = self._rng
        completions = "/v1/completions"
        if kind == "bad_json":
            raw = rng.choice((b'{"prompt": "unterminated', b"{]", b'{"prompt": "a",}', b"null"))
            return Case(kind, "POST", completions, raw, expect=(400,))
        if kind == "bad_type":
            body = rng.choice(({"prompt": 5}, {"prompt": "hi", "max_tokens": "eight"},
                               {"prompt": "hi", "n": 2.5}, {"messages": "hello"},
                               {"prompt": "hi", "temperature": "hot"}))
            path = "/v1/chat/completions" if "messages" in body else completions
            return Case(kind, "POST", path, body, expect=(400,))
        if kind == "bad_model":
            return Case(kind, "POST", completions,
                        {"model": f"no-such-model-{rng.randrange(100)}", "prompt": "hi"},
                        expect=(404,))
        if kind == "over_context":
            extra = rng.randint(0, 64)
            form = rng.choice(("ids", "words", "blob"))
            prompt: str | list[int]
            if form == "ids":  # counted exactly, nothing to tokenize
                prompt = [rng.randrange(self.vocab_size) for _ in range(self.max_model_len + extra)]
            elif form == "words":  # text that must be tokenized to be found too long
                prompt = _text(rng, self.max_model_len + 200 + extra)
            else:  # one long run of a letter: few ids per token, the tokenizer's worst case
                prompt = "x" * (self.max_model_len * 32 + extra)
            return Case(kind, "POST", completions,
                        {"model": self.model, "prompt": prompt, "max_tokens": 4},
                        expect=(400, 413))
        if kind == "bad_token_ids":
            ids = [rng.randrange(self.vocab_size) for _ in range(rng.randint(1, 20))]
            ids.insert(rng.randrange(len(ids) + 1),
                       rng.choice((-1, self.vocab_size, self.vocab_size + 12345)))
            return Case(kind, "POST", completions,
                        {"model": self.model, "prompt": ids, "max_tokens": 4}, expect=(400,))
        if kind == "bad_n":
            return Case(kind, "POST", completions,
                        {"model": self.model, "prompt": "hi", "n": rng.choice((0, -1, 1000))},
                        expect=(400,))
        if kind == "bad_max_tokens":
            return Case(kind, "POST", completions,
                        {"model": self.model, "prompt": "hi",
                         "max_tokens": rng.choice((0, -5, self.max_model_len * 2))},
                        expect=(400,))
        if kind == "empty_messages":
            return Case(kind, "POST", "/v1/chat/completions",
                        {"model": self.model, "messages": []}, expect=(400,))
        raise ValueError(f"unknown case kind {kind!r}")
