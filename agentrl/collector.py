"""The garbage collector of the process that runs the rollouts: many episodes' turns interleaved
in one event loop, each collector pass a stall of all of them.

`settle()` freezes the set-up's objects (modules, tokenizers, configs: ~290k) out of the full
passes, and spaces the young ones: CPython passes over its youngest generation every 700 net new
container objects (every 10th pass also the next generation). A turn keeps a few dozen alive
across its request (the payload, the parsed answer, the turn's records), so with 256 episodes in
flight the passes kept walking the same in-flight state: 611 young, 55 middle and 5 full passes
in 8 rounds of `bench/rollout_overhead.py --http --gc-freeze`, 77 us of CPU a request; with
YOUNG 30 and 2 passes, 25 us. Garbage in reference cycles waits that much longer (memory: tens
of thousands of small objects at most); nothing else changes.
"""

from __future__ import annotations

import gc

YOUNG = 10_000  # net new container objects between young passes (CPython's default: 700)


def settle() -> tuple[int, ...]:
    """Freeze what exists, space the young passes (YOUNG); returns the thresholds it replaced,
    for `restore`."""
    before = gc.get_threshold()
    gc.collect()
    gc.freeze()
    gc.set_threshold(YOUNG, *before[1:])
    return before


def restore(before: tuple[int, ...]) -> None:
    """Undo `settle`: the thresholds `before`, the frozen objects collectable again."""
    gc.set_threshold(*before)
    gc.unfreeze()
