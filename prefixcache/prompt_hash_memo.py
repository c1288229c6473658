"""PromptHashMemo: the chained block hashes of recent prompts, reused by the next prompt that
shares their prefix.

Agents resend their whole history each turn and RAG pipelines resend the same documents, so a
prompt a router hashes now mostly repeats one it hashed before. Chaining 2,048 blocks (a
32K-token prompt, 16-token blocks) costs ~0.35 ms of Python calls; comparing the prompt with
a remembered one is one numpy pass (~20 us). The memo keeps the tokens and hashes of the last
``capacity`` prompts; a new prompt is compared with the ``probes`` most recent ones that
start with the same block (after the first, only those that also have the prompt's block
where the best so far stops), and takes the hashes of the longest common run of full blocks:
only the blocks after it are chained. Tokens are compared, not digests, so what it returns is
always exactly the fresh chain.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

ChainFrom = Callable[[int, int | None], list[int]]
"""``chain(first_block, parent_hash or None for the root) -> hashes of blocks first..end``."""


@dataclass(eq=False)  # entries are removed by identity
class _Entry:
    first_block: bytes  # the prompt's first block, as bytes (candidates are found by it)
    tokens: np.ndarray  # [blocks * block_size] int32: the prompt's full blocks
    hashes: list[int]  # [blocks]


class PromptHashMemo:
    """``hashes(tokens, block_size, chain)``: the prompt's full-block hashes as ``chain``
    computes them, the longest prefix shared with a recent prompt taken from the memo."""

    def __init__(self, capacity: int = 32, probes: int = 4) -> None:
        if capacity < 1 or probes < 1:
            raise ValueError("capacity and probes must be positive")
        self.capacity = capacity
        self.probes = probes
        self._entries: list[_Entry] = []  # most recent last
        self.hits = 0
        self.reused_blocks = 0

    def hashes(self, tokens: np.ndarray, block_size: int, chain: ChainFrom) -> list[int]:
        """``tokens`` [num_tokens] int32, C-contiguous. The list may be the memo's own: read
        it only."""
        blocks = len(tokens) // block_size
        if blocks == 0:
            return []
        full = tokens[: blocks * block_size]
        first = full[:block_size].tobytes()
        best, shared = None, 0  # the entry sharing the most full blocks, and how many
        tried = 0
        for entry in reversed(self._entries):
            if entry.first_block != first:
                continue
            if shared:  # it can share more only if it has our block where the best stops
                next_block = slice(shared * block_size, (shared + 1) * block_size)
                if not np.array_equal(entry.tokens[next_block], full[next_block]):
                    continue
            common = _common_blocks(entry.tokens, full, block_size)
            if common > shared:
                best, shared = entry, common
            tried += 1
            if shared == blocks or tried == self.probes:
                break
        if shared:
            self.hits += 1
            self.reused_blocks += shared
        if best is not None and shared == blocks:
            self._touch(best)
            return best.hashes if len(best.hashes) == blocks else best.hashes[:blocks]
        reused = best.hashes[:shared] if best is not None else []
        hashes = reused + chain(shared, reused[-1] if reused else None)
        if best is not None and shared == len(best.hashes):  # it extends that prompt
            self._entries.remove(best)
        self._entries.append(_Entry(first, full.copy(), hashes))
        if len(self._entries) > self.capacity:
            del self._entries[0]
        return hashes

    def _touch(self, entry: _Entry) -> None:
        self._entries.remove(entry)
        self._entries.append(entry)


def _common_blocks(held: np.ndarray, tokens: np.ndarray, block_size: int) -> int:
    """Full blocks at the start of ``tokens`` equal to ``held``'s."""
    length = min(len(held), len(tokens))
    differ = held[:length] != tokens[:length]
    first = int(differ.argmax()) if length else 0
    return (first if length and differ[first] else length) // block_size
