"""A request's text kept up to date token by token (``SequenceText``) equals decoding its whole
output at every step, for byte-level tokenizers (decoding only the new tokens) and others
(decoding everything), and stop strings are found where a search of the whole text finds them."""

from __future__ import annotations

import random

import pytest
from model_layer_helpers import train_tiny_tokenizer
from tokenizers import Tokenizer as BackendTokenizer
from tokenizers import decoders, models, pre_tokenizers

from prefixcache.engine.request import Request, RequestStatus
from prefixcache.engine.sampling_params import SamplingParams
from prefixcache.engine.stop_checker import SequenceText, check_stop
from prefixcache.engine.tokenizer import Tokenizer

PROMPT = [5, 6, 7]


@pytest.fixture(scope="module")
def tokenizer() -> Tokenizer:
    return Tokenizer(train_tiny_tokenizer())


def random_outputs(tokenizer: Tokenizer, count: int, seed: int) -> list[list[int]]:
    """Output id streams mixing any token, tokens that are single bytes of multi-byte UTF-8
    characters (so characters split and break), words with such characters, and specials."""
    rng = random.Random(seed)
    vocab = tokenizer.vocab_size
    high = [i for i in range(vocab) if any(ord(c) >= 0xA1 for c in tokenizer.id_to_token(i))]
    words = tokenizer.encode("naïve 日本語 😀👩‍👧 done")
    assert high and words
    streams = []
    for _ in range(count):
        stream: list[int] = []
        while len(stream) < rng.randint(1, 40):
            kind = rng.random()
            if kind < 0.3:
                stream.append(rng.randrange(vocab))
            elif kind < 0.7:
                stream.append(rng.choice(high))
            elif kind < 0.9:
                stream.extend(words[rng.randrange(len(words)) :][: rng.randint(1, 4)])
            else:
                stream.append(rng.choice([0, 1, 2]))  # the specials
        streams.append(stream)
    return streams


def whole_decode(tokenizer: Tokenizer, ids: list[int], finished: bool) -> str:
    """What a running request's text must be: all its output decoded, a trailing incomplete
    character held back until it finishes."""
    text = tokenizer.decode(ids)
    return text[:-1] if text.endswith("\ufffd") and not finished else text


def request_with(tokens: list[int], max_tokens: int = 64, **params: object) -> Request:
    return Request("r", PROMPT, SamplingParams(max_tokens=max_tokens, **params))


@pytest.mark.parametrize("prefix_stable", [True, False])
def test_text_equals_the_whole_decode_at_every_step(tokenizer: Tokenizer,
                                                    prefix_stable: bool) -> None:
    assert tokenizer.decode_concatenates
    for ids in random_outputs(tokenizer, 300, seed=1):
        request = request_with(ids)
        text = SequenceText(tokenizer.decode, prefix_stable)
        for index, token in enumerate(ids):
            request.append_token(token)
            if index % 3 == 0 or index == len(ids) - 1:  # not every step updates
                assert text.update(request) == whole_decode(tokenizer, ids[: index + 1], False)
        request.status = RequestStatus.FINISHED
        assert text.update(request) == whole_decode(tokenizer, ids, True)


def test_prefix_stable_text_decodes_only_new_tokens(tokenizer: Tokenizer) -> None:
    decoded: list[int] = []

    def counting_decode(ids: list[int]) -> str:
        decoded.append(len(ids))
        return tokenizer.decode(ids)

    ids = tokenizer.encode("the cache keeps every prefix " * 40)
    request = request_with(ids, max_tokens=len(ids))
    text = SequenceText(counting_decode, prefix_stable=True)
    for token in ids:
        request.append_token(token)
        text.update(request)
    assert text.text == tokenizer.decode(ids)
    assert sum(decoded) == len(ids)  # each id decoded once: ASCII text always settles
    whole = SequenceText(tokenizer.decode, prefix_stable=False)
    assert whole.update(request) == text.text


def test_stop_strings_are_found_where_a_whole_search_finds_them(tokenizer: Tokenizer) -> None:
    rng = random.Random(7)
    stops_seen = 0
    for ids in random_outputs(tokenizer, 300, seed=2):
        full = tokenizer.decode(ids)
        stop = full[rng.randrange(len(full)) :][: rng.randint(1, 3)] if full else "x"
        results = []
        for prefix_stable in (True, False):
            request = request_with(ids, stop=[stop, "never there"], max_tokens=len(ids))
            text = SequenceText(tokenizer.decode, prefix_stable)
            reason = None
            for token in ids:
                request.append_token(token)
                reason = check_stop(request, text, eos_token_ids=(), max_model_len=4096)
                if reason is not None:
                    break
            results.append((reason, request.stop_reason, request.num_tokens, text.text))
        assert results[0] == results[1]
        reason, stop_reason, _, cut = results[0]
        if stop_reason == stop:
            stops_seen += 1
            assert stop not in cut and full.startswith(cut)
    assert stops_seen > 100


def test_only_byte_level_decoders_are_prefix_stable() -> None:
    metaspace = BackendTokenizer(models.BPE())
    metaspace.pre_tokenizer = pre_tokenizers.Metaspace()
    metaspace.decoder = decoders.Metaspace()  # strips the first token's leading space
    assert not Tokenizer(metaspace).decode_concatenates
