"""The dev server's prefix cache (agentrl/engine/dev/cache.py): longest prefix, never the last token,
a hash collision matches nothing, least recently used entries go first past the byte budget."""

from __future__ import annotations

import torch

from agentrl.engine.dev.cache import BLOCK, PrefixCache, block_hashes


def kv(tokens: list[int], layers: int = 2) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Keys/values whose every column holds its token id: slices are easy to check."""
    col = torch.tensor(tokens, dtype=torch.float32)[None, :, None].expand(2, -1, 4)
    return [(col.clone(), -col.clone()) for _ in range(layers)]


def test_longest_prefix_leaving_the_last_token():
    cache = PrefixCache(1 << 20)
    seq = list(range(100, 150))
    cache.put(seq, kv(seq))
    hit = cache.get(seq + [1, 2])
    assert hit is not None and hit.tokens == len(seq)
    assert torch.equal(hit.kv[0][0][0, :, 0], torch.tensor(seq, dtype=torch.float32))
    assert cache.get(seq).tokens == len(seq) - 1  # the forward needs one position
    assert cache.get(seq[:30] + [7] * 10).tokens == 30  # diverges inside the second block
    assert cache.get([5] * 40) is None
    assert cache.get(seq[:10]) is None  # under one block


def test_a_hash_collision_matches_nothing(monkeypatch):
    cache = PrefixCache(1 << 20)
    seq = list(range(40))
    cache.put(seq, kv(seq))
    other = [9] * 40
    monkeypatch.setattr(
        "agentrl.engine.dev.cache.block_hashes", lambda t: block_hashes(seq[: len(t)])
    )
    assert cache.get(other) is None


def test_least_recently_used_goes_first():
    one_entry = sum(k.nbytes + v.nbytes for k, v in kv(list(range(BLOCK * 2))))
    cache = PrefixCache(2 * one_entry)
    a, b, c = ([i + off for i in range(BLOCK * 2)] for off in (0, 1000, 2000))
    cache.put(a, kv(a))
    cache.put(b, kv(b))
    assert cache.get(a + [1]) is not None  # a is now the most recently used
    cache.put(c, kv(c))
    assert len(cache) == 2 and cache.nbytes == 2 * one_entry
    assert cache.get(b + [1]) is None and cache.get(a + [1]) and cache.get(c + [1])
    cache.clear()
    assert len(cache) == 0 and cache.get(a + [1]) is None
    off = PrefixCache(0)
    off.put(a, kv(a))
    assert len(off) == 0
