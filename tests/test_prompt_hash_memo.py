"""PromptHashMemo: a prompt's hashes equal a fresh chain whatever the memo remembers, and a
prompt that repeats or extends a recent one chains only its new blocks."""

from __future__ import annotations

import random

import numpy as np
import pytest

from prefixcache.cluster_index import ROOT_SEED
from prefixcache.hashing import chain_block_hashes, xxh3_block_hasher
from prefixcache.prompt_hash_memo import PromptHashMemo

BS = 4


def fresh(tokens: np.ndarray) -> list[int]:
    return chain_block_hashes(tokens, BS, 0, len(tokens) // BS, ROOT_SEED, xxh3_block_hasher)


def memo_hashes(memo: PromptHashMemo, tokens: np.ndarray, chained: list[int]) -> list[int]:
    def chain(first: int, parent: int | None) -> list[int]:
        chained.append(len(tokens) // BS - first)
        seed = ROOT_SEED if parent is None else parent
        return chain_block_hashes(tokens, BS, first, len(tokens) // BS, seed, xxh3_block_hasher)

    return memo.hashes(tokens, BS, chain)


@pytest.mark.parametrize("seed", range(4))
def test_hashes_equal_a_fresh_chain_for_any_history(seed: int) -> None:
    rng = random.Random(seed)
    memo = PromptHashMemo(capacity=5, probes=2)
    history: list[list[int]] = [[rng.randrange(9) for _ in range(rng.randrange(0, 30))]]
    for _ in range(200):
        base = rng.choice(history[-8:])
        cut = rng.randrange(len(base) + 1)  # a prefix of a recent prompt, then new tokens
        prompt = base[:cut] + [rng.randrange(9) for _ in range(rng.randrange(0, 12))]
        history.append(prompt)
        tokens = np.array(prompt, dtype=np.int32)
        assert memo_hashes(memo, tokens, []) == fresh(tokens)
    assert len(memo._entries) <= 5 and memo.hits > 0 and memo.reused_blocks > 0


def test_a_repeat_and_an_extension_chain_only_new_blocks() -> None:
    memo = PromptHashMemo()
    history = np.arange(400, dtype=np.int32)
    chained: list[int] = []
    memo_hashes(memo, history, chained)
    assert chained == [100]
    memo_hashes(memo, history, chained)  # resent as is
    assert chained == [100]
    turn = np.concatenate([history, np.arange(9, dtype=np.int32)])  # two more blocks, a bit
    assert memo_hashes(memo, turn, chained) == fresh(turn)
    assert chained == [100, 2] and memo.reused_blocks == 200
    other = np.arange(1, 401, dtype=np.int32)  # same length, other tokens: nothing reused
    assert memo_hashes(memo, other, chained) == fresh(other)
    assert chained[-1] == 100
    question = turn.copy()  # the same document, another question in its last block
    question[-9:] = 7
    assert memo_hashes(memo, question, chained) == fresh(question)
    assert chained[-1] == 2  # the two blocks from the first changed token on
    assert memo_hashes(memo, history[:50], chained) == fresh(history[:50])  # a prefix of one
    assert chained[-1] == 2 and len(memo._entries) == 3  # the turn replaced the history


def test_bad_sizes_are_refused() -> None:
    with pytest.raises(ValueError):
        PromptHashMemo(capacity=0)
