"""RAG middleware: canonical prompts from (system, retrieved chunks, question), cache-aware
chunk order, and document warming.

A retriever returns the right chunks in an order that varies with the query; pasted as is,
each order is a new token prefix and a cache miss. ``RagPromptBuilder`` formats each chunk
canonically and puts the set in a fixed order (by chunk id), so the same retrieved set always
yields the same prefix. ``RagMiddleware`` can go further: among the chunks of a query it picks,
one position at a time, the chunk that extends the longest already-cached prefix
(``cache_aware=True``), then the rest in canonical order. The question always comes last.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from prefixcache.integrations.sdk.canonical import canonical_text
from prefixcache.integrations.sdk.results import Completion

# Ends the context of a cache-aware lookup probe (see ``RagPromptBuilder.probe_messages``): a
# symbol that, like the "[" opening the next chunk, follows the last chunk's blank line, but
# that neither a chunk header nor a chat template ever puts there.
PROBE_END = "\u2400"


class MiddlewareSalt(enum.Enum):
    """``MIDDLEWARE_SALT``: "the middleware's own ``salt``" (None means no salt)."""

    DEFAULT = "middleware salt"


MIDDLEWARE_SALT = MiddlewareSalt.DEFAULT


@dataclass(frozen=True)
class RetrievedChunk:
    """A retrieved passage; ``id`` names it stably (e.g. "doc-12#3")."""

    id: str
    text: str


class WarmDocumentsError(RuntimeError):
    """``RagMiddleware.warm_documents`` could not warm the chunk ``chunk_id``; the client's
    error is ``__cause__``. The pins that call had made were released (``pins_left``: how many
    could not be, 0 normally)."""

    def __init__(self, chunk_id: str, error: BaseException, pins_left: int = 0) -> None:
        left = f"; {pins_left} of its pins could not be released" if pins_left else ""
        super().__init__(f"could not warm chunk {chunk_id!r}: {error}{left}")
        self.chunk_id, self.pins_left = chunk_id, pins_left


class RagClient(Protocol):
    """What the middleware needs: ``Client`` and ``LocalClient`` both fit."""

    def chat(self, messages: Sequence[Mapping[str, Any]], **options: Any) -> Completion: ...

    def lookup(self, prompt: Any = None, *, messages: Any = None, salt: str | None = None
               ) -> int: ...

    def warm(self, prompt: Any = None, *, messages: Any = None, pin: bool = False,
             salt: str | None = None) -> int: ...

    def unpin(self, prompt: Any = None, *, messages: Any = None, salt: str | None = None
              ) -> None: ...


class RagPromptBuilder:
    """Chat messages ``[system + context, user question]`` with canonical formatting."""

    def __init__(self, system: str, context_header: str = "Context documents:") -> None:
        self.system = canonical_text(system)
        self.context_header = context_header

    @staticmethod
    def canonical_order(chunks: Iterable[RetrievedChunk]) -> list[RetrievedChunk]:
        """Sorted by id, one chunk per id: one order per retrieved set.

        Of chunks sharing an id the first is kept (retrievers rank best first), whatever its
        text. Ids must be strings: TypeError names the first chunk whose id is not."""
        unique: dict[str, RetrievedChunk] = {}
        for chunk in chunks:
            if not isinstance(chunk.id, str):
                raise TypeError(f"chunk ids must be str, got {type(chunk.id).__name__} id "
                                f"{chunk.id!r}")
            unique.setdefault(chunk.id, chunk)
        return [unique[key] for key in sorted(unique)]

    def format_chunk(self, chunk: RetrievedChunk) -> str:
        return f"[{chunk.id}]\n{canonical_text(chunk.text)}\n\n"

    def system_content(self, ordered: Sequence[RetrievedChunk]) -> str:
        """The system message text for chunks already in their final order."""
        context = "".join(self.format_chunk(chunk) for chunk in ordered)
        return f"{self.system}\n\n{self.context_header}\n\n{context}"

    def messages(self, question: str, ordered: Sequence[RetrievedChunk]) -> list[dict[str, str]]:
        """The prompt for ``question`` over chunks in the given order."""
        return [{"role": "system", "content": self.system_content(ordered)},
                {"role": "user", "content": canonical_text(question)}]

    def prefix_messages(self, ordered: Sequence[RetrievedChunk]) -> list[dict[str, str]]:
        """The cacheable part (system + context), for lookups and warming."""
        return [{"role": "system", "content": self.system_content(ordered)}]

    def probe_messages(self, ordered: Sequence[RetrievedChunk]) -> list[dict[str, str]]:
        """Messages whose rendering is that of any real prompt starting with ``ordered`` up
        to the end of those chunks, then ``PROBE_END``, which no cached prompt has there.

        Looking them up counts only the cached tokens a real prompt with these chunks first
        is sure to share: not the chat template's end of turn that ``prefix_messages`` renders
        (a real prompt continues with the next chunk or the question instead)."""
        return [{"role": "system", "content": self.system_content(ordered) + PROBE_END},
                {"role": "user", "content": PROBE_END}]


class RagMiddleware:
    """Ask questions over retrieved chunks through ``client`` with reusable prefixes.

    ``canonical=False`` keeps the retriever's order (the baseline the benchmark compares
    against); ``cache_aware`` orders by cached-prefix extension (one lookup per candidate per
    position: O(k^2) lookups for k chunks)."""

    def __init__(self, client: RagClient, builder: RagPromptBuilder, *, canonical: bool = True,
                 cache_aware: bool = True, salt: str | None = None) -> None:
        self.client, self.builder = client, builder
        self.canonical, self.cache_aware, self.salt = canonical, cache_aware, salt

    def order(self, chunks: Sequence[RetrievedChunk],
              salt: str | MiddlewareSalt | None = MIDDLEWARE_SALT) -> list[RetrievedChunk]:
        """The order the chunks go into the prompt. Cache-aware ordering looks the cache up
        under ``salt`` (default: the middleware's), which must be the salt the prompt is
        sent with: another salt's cache is not the one the request can hit."""
        if not self.canonical:
            return list(chunks)
        remaining = self.builder.canonical_order(chunks)
        if not self.cache_aware or not remaining:
            return remaining
        salt = self.salt if salt is MIDDLEWARE_SALT else salt
        chosen: list[RetrievedChunk] = []
        cached = self._cached(chosen, salt)
        while remaining:
            scored = [(self._cached([*chosen, chunk], salt), -i, chunk)
                      for i, chunk in enumerate(remaining)]
            best_cached, _, best = max(scored, key=lambda item: (item[0], item[1]))
            if best_cached <= cached:
                break  # nothing extends the cached prefix: the rest in canonical order
            chosen.append(best)
            remaining.remove(best)
            cached = best_cached
        return chosen + remaining

    def messages(self, question: str, chunks: Sequence[RetrievedChunk],
                 salt: str | MiddlewareSalt | None = MIDDLEWARE_SALT) -> list[dict[str, str]]:
        """The prompt for ``question``, chunks ordered for a request under ``salt``."""
        return self.builder.messages(question, self.order(chunks, salt))

    def ask(self, question: str, chunks: Sequence[RetrievedChunk], **options: Any) -> Completion:
        """Answer ``question`` from ``chunks``; ``usage.cached_tokens`` shows the reuse.
        ``salt`` in ``options`` (default: the middleware's) is used for the request and for
        ordering the chunks alike."""
        options.setdefault("salt", self.salt)
        return self.client.chat(self.messages(question, chunks, options["salt"]), **options)

    def warm_documents(self, chunks: Iterable[RetrievedChunk], pin: bool = False) -> int:
        """Prefill the system prompt followed by each chunk alone, so any query whose prompt
        starts with that chunk hits the cache; returns the tokens cached in total.

        All or nothing for pins: if a chunk cannot be warmed (too long for the model, a
        server error), the pins this call already made are released and
        ``WarmDocumentsError`` names the chunk (the chunks before it stay cached, unpinned)."""
        total = 0
        pinned: list[list[dict[str, str]]] = []  # the prefixes this call pinned
        for chunk in self.builder.canonical_order(chunks):
            prefix = self.builder.prefix_messages([chunk])
            try:
                cached = self.client.warm(messages=prefix, pin=pin, salt=self.salt)
            except Exception as error:
                raise WarmDocumentsError(chunk.id, error, self._unpin_all(pinned)) from error
            if pin and cached:  # 0 cached tokens: nothing was pinned
                pinned.append(prefix)
            total += cached
        return total

    def _unpin_all(self, prefixes: Sequence[list[dict[str, str]]]) -> int:
        """Release one pin on each prefix; returns how many could not be released."""
        failed = 0
        for prefix in prefixes:
            try:
                self.client.unpin(messages=prefix, salt=self.salt)
            except Exception:  # keep releasing the others; the count is reported
                failed += 1
        return failed

    def _cached(self, ordered: Sequence[RetrievedChunk], salt: str | None) -> int:
        """Cached tokens that every real prompt starting with ``ordered`` shares (through the
        end of those chunks; see ``RagPromptBuilder.probe_messages``)."""
        return self.client.lookup(messages=self.builder.probe_messages(ordered), salt=salt)
