"""Generation options shared by every client, and their two encodings (JSON body, params)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

from prefixcache.engine.sampling_params import SamplingParams
from prefixcache.engine.structured_output import StructuredOutput


@dataclass(frozen=True)
class GenerationOptions:
    """The OpenAI fields the SDK passes through (None: the server's default).

    ``stop`` may be given as one string or a list of strings (None: no stop string), as in the
    OpenAI API; it is stored as a list, so a single string stays one stop string. ``tools``,
    ``tool_choice``, ``parallel_tool_calls``, ``response_format`` and ``structured_outputs``
    (vLLM's) are OpenAI's chat fields, passed as given."""

    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    seed: int | None = None
    n: int = 1
    stop: list[str] = field(default_factory=list)
    salt: str | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    response_format: dict[str, Any] | None = None
    structured_outputs: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "stop", stop_strings(self.stop))

    def openai_fields(self) -> dict[str, Any]:
        """The request-body fields (unset ones left out, so any OpenAI server accepts them)."""
        fields = {k: v for k, v in asdict(self).items() if v not in (None, []) and k != "salt"}
        if self.n == 1:
            fields.pop("n")
        if self.salt is not None:
            fields["cache_salt"] = self.salt
        return fields

    def sampling_params(self, default_max_tokens: int,
                        structured: StructuredOutput | None = None) -> SamplingParams:
        """Engine params for in-process calls (raises TypeError/ValueError like the engine)."""
        return SamplingParams(
            max_tokens=self.max_tokens if self.max_tokens is not None else default_max_tokens,
            temperature=1.0 if self.temperature is None else self.temperature,
            top_p=1.0 if self.top_p is None else self.top_p,
            seed=self.seed, n=self.n, stop=list(self.stop), structured=structured,
        )


def stop_strings(stop: str | Iterable[str] | None) -> list[str]:
    """``stop`` as a list: a string is one stop string (never split into its characters)."""
    if stop is None:
        return []
    if isinstance(stop, str):
        return [stop]
    if not isinstance(stop, Iterable):
        raise TypeError(f"stop must be a string or a list of strings, not {type(stop).__name__}")
    return list(stop)
