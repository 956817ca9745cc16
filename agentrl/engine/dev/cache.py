"""The dev server's prefix cache (`agentrl.engine.dev --prefix-cache-mb`): the KV of sequences it
has computed, reused for any later prompt that starts with the same tokens, as SGLang's radix
cache does. An agent's turn k+1 prompt is turn k's prompt + its output + the observation, and the
samples of a group share their prompt, so most prompt tokens of a multi-turn rollout are cached.

Entries are whole sequences (their per-layer keys and values, [kv_heads, tokens, head_dim]),
indexed by a hash chain over `BLOCK`-token blocks: looking up a prompt walks its blocks and keeps
the deepest entry that holds them (tokens compared once, so a hash collision cannot match).
Least recently used entries go first when the entries' bytes pass the budget. Every entry is
computed by the current weights: the engine clears the cache whenever the weights change.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import torch

BLOCK = 16


@dataclass
class Entry:
    tokens: list[int]
    kv: list[tuple[torch.Tensor, torch.Tensor]]  # per layer: keys, values [kv_heads, n, d]
    hashes: list[int]
    nbytes: int


@dataclass
class Hit:
    tokens: int  # how many leading tokens of the prompt the cache holds
    kv: list[tuple[torch.Tensor, torch.Tensor]]  # per layer, [kv_heads, tokens, head_dim]


def block_hashes(tokens: list[int]) -> list[int]:
    """The hash chain of every full block: entry i covers tokens[: (i + 1) * BLOCK]."""
    out, h = [], 0
    for start in range(0, len(tokens) - BLOCK + 1, BLOCK):
        h = hash((h, *tokens[start : start + BLOCK]))
        out.append(h)
    return out


class PrefixCache:
    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.entries: OrderedDict[int, Entry] = OrderedDict()  # id -> entry, oldest first
        self.index: dict[int, int] = {}  # block hash -> the id of the newest entry holding it
        self.nbytes = 0
        self._next = 0

    def __len__(self) -> int:
        return len(self.entries)

    @property
    def on(self) -> bool:
        return self.max_bytes > 0

    def get(self, tokens: list[int]) -> Hit | None:
        """The longest cached prefix of `tokens`, leaving at least its last token to compute (the
        forward that follows needs one position to produce the next token's logits)."""
        best: tuple[int, int] | None = None  # (entry id, blocks)
        for i, h in enumerate(block_hashes(tokens[:-1])):
            eid = self.index.get(h)
            if eid is None or eid not in self.entries:
                break
            best = (eid, i + 1)
        if best is None:
            return None
        eid, blocks = best
        entry = self.entries[eid]
        n = blocks * BLOCK
        if entry.tokens[:n] != tokens[:n]:  # a hash collision: no match at all
            return None
        # the entry may go on matching past the last full block of the prompt
        limit = min(len(entry.tokens), len(tokens) - 1)
        while n < limit and entry.tokens[n] == tokens[n]:
            n += 1
        self.entries.move_to_end(eid)
        return Hit(n, [(k[:, :n], v[:, :n]) for k, v in entry.kv])

    def put(self, tokens: list[int], kv: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        """Keep the KV of `tokens` (copied: the batch's tensors are not held). Sequences shorter
        than one block are not worth an entry."""
        if len(tokens) < BLOCK or not self.on:
            return
        kv = [(k.contiguous().clone(), v.contiguous().clone()) for k, v in kv]
        nbytes = sum(k.nbytes + v.nbytes for k, v in kv)
        if nbytes > self.max_bytes:
            return
        hashes = block_hashes(tokens)
        eid, self._next = self._next, self._next + 1
        self.entries[eid] = Entry(list(tokens), kv, hashes, nbytes)
        self.nbytes += nbytes
        for h in hashes:
            self.index[h] = eid
        while self.nbytes > self.max_bytes:
            self._evict()

    def _evict(self) -> None:
        eid, entry = self.entries.popitem(last=False)
        self.nbytes -= entry.nbytes
        for h in entry.hashes:
            if self.index.get(h) == eid:
                del self.index[h]

    def clear(self) -> None:
        self.entries.clear()
        self.index.clear()
        self.nbytes = 0
