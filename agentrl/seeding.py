"""Sampling seeds for `trainer.deterministic`: every engine request's seed follows from where it
sits in the run, never from timing.

    with sampling_round(seed=0, name="step 3"):   # the trainer, around one step's rollouts
        groups = await rollout.run(tasks)         # each turn sends SamplingParams(seed=...)

A request's seed is a hash of (run seed, round, task id, group slot, sample index, turn). Without
one the engine draws from a generator of its own, shared by whatever requests timing put in the
same batch, so the same command samples other tokens in another run. Outside a round
(trainer.deterministic=false, `agentrl preview`) requests carry no seed, as before.

The round is a context variable rather than an argument: every caller of a `Rollout` inside it
(the step's groups, dynamic sampling's refills, groups re-issued after a server failed, a mixture
of envs, the evaluation in a round of its own) is seeded without passing it down; asyncio tasks
copy it when they are created.

Group slots: one task can appear twice in a round (the sampler wraps into a new epoch, or the
task list is short); the n-th group of a task id to start in a round has slot n, so the two
groups sample differently. Groups start in launch order (asyncio runs new tasks first in, first
out) before their first await, so slots do not follow timing either.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field

SEED_BITS = 31  # any engine takes it (SGLang's sampling_seed, torch.Generator.manual_seed)


@dataclass
class SamplingRound:
    """The rollouts of one round (a training step, an evaluation) of a seeded run."""

    seed: int
    name: str
    slots: Counter[str] = field(default_factory=Counter)  # groups started per task id


_ROUND: ContextVar[SamplingRound | None] = ContextVar("agentrl_sampling_round", default=None)


@contextmanager
def sampling_round(seed: int | None, name: str) -> Iterator[None]:
    """Seed the engine requests of the rollouts run inside; `seed` None leaves them unseeded.
    `name` tells rounds apart: each must have its own ("step 3", "eval after step 2")."""
    if seed is None:
        yield
        return
    token = _ROUND.set(SamplingRound(seed, name))
    try:
        yield
    finally:
        _ROUND.reset(token)


def group_slot(task_id: str) -> int:
    """The slot of a group of `task_id` starting now: how many groups of it started before in
    this round (0 outside a round). Call once per group, before its first await."""
    r = _ROUND.get()
    if r is None:
        return 0
    slot = r.slots[task_id]
    r.slots[task_id] += 1
    return slot


def episode_key(task_id: str, slot: int, sample_index: int) -> str | None:
    """What an episode's seeds are derived from; None outside a round (unseeded requests)."""
    r = _ROUND.get()
    if r is None:
        return None
    return f"{r.seed}\x1f{r.name}\x1f{task_id}\x1f{slot}\x1f{sample_index}"


def turn_seed(key: str | None, turn: int) -> int | None:
    """The sampling seed of an episode's `turn`-th request (None: unseeded)."""
    if key is None:
        return None
    digest = hashlib.blake2b(f"{key}\x1f{turn}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") % (1 << SEED_BITS)
