"""Where a step's groups come from: one protocol (`GroupSource`), two implementations.

- `SyncGroups` (trainer.mode=sync): the step's tasks are rolled out now, with
  `trainer.sampling.oversample_groups` extra (the first `tasks_per_step` to finish are kept);
  with `trainer.sampling.dynamic_sampling` the groups that carry no gradient are dropped and more
  tasks rolled out, up to `trainer.sampling.max_refill_rounds` extra rounds.
- `AsyncGroups` (trainer.mode=async): rollouts run ahead of the learner in a `GroupProducer`
  (agentrl/producer.py: staleness, launch budget, dynamic sampling there too); a step takes the
  next groups in launch order.

In both, every group set goes through `Reissue` before the step sees it: the sandbox service
this run started is restarted if it died; dead or hung rollout servers are restarted (by the
hand-over, agentrl/handover.py) and get the current weights; the groups that lost an episode to
either are rolled out again, whole, so every group's baseline compares samples of one policy.
Episodes still without a sandbox past `trainer.guards.max_unavailable_frac` of the step stop the
run.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from agentrl.data import TaskSampler
from agentrl.metrics import sampled_reward_metrics
from agentrl.mixture import MixtureRollout, MixtureSampler
from agentrl.producer import GroupProducer
from agentrl.rollout import Rollout, engine_lost
from agentrl.sandbox.base import Revivable, SandboxUnavailable
from agentrl.types import StopReason, Task, TrainingError, Trajectory

Groups = list[list[Trajectory]]
Keep = Callable[[list[Trajectory]], bool]


class GroupSource(Protocol):
    """A step's groups. Used as `async with source:` around the steps (async: the producer
    runs inside it); `take(step)` returns step `step`'s groups and their rollout metrics;
    `advance(version)` says the engines serve `version` now; `state_dict()` is what a checkpoint
    keeps of the work in flight. `concurrent`: rollouts run while the learner works."""

    concurrent: bool

    async def __aenter__(self) -> GroupSource: ...
    async def __aexit__(self, *exc: object) -> None: ...
    async def take(self, step: int) -> tuple[Groups, dict[str, float]]: ...
    def advance(self, version: int) -> None: ...
    def state_dict(self) -> dict[str, Any]: ...


class Recovers(Protocol):
    """The engines' side of a re-issue (agentrl/handover.py: Handover.recover)."""

    async def recover(self, step: int, suspect: bool) -> int: ...


def lost(tr: Trajectory) -> bool:
    """An episode the system lost (its engine, or its sandbox): its group is rolled out again."""
    return engine_lost(tr) or tr.stop_reason == StopReason.SANDBOX_UNAVAILABLE


class Reissue:
    """After every rollout (module docstring): restarts, then the lost groups again, whole."""

    def __init__(
        self,
        rollout: Rollout | MixtureRollout,
        engines: Recovers,
        group_size: int,
        max_unavailable_frac: float,
        logs: str,
    ) -> None:
        self.rollout, self.engines = rollout, engines
        self.group_size, self.max_unavailable_frac = group_size, max_unavailable_frac
        self.logs = logs  # where the servers' logs are, for the messages
        self.sandbox_restarts = 0  # the sandbox client's restarts counted so far

    async def __call__(
        self, tasks: list[Task], groups: Groups, step: int
    ) -> tuple[Groups, dict[str, float]]:
        """`groups` (of `tasks`, aligned) with the lost ones rolled out again; the metrics
        engine/restarts, sandbox/restarts, rollout/reissued. Servers we did not start
        (`engine.urls`) are not restarted: the run stops with their names."""
        again_at = [i for i, g in enumerate(groups) if any(lost(tr) for tr in g)]
        revived = await self._revive_sandbox(step)
        restarted = await self.engines.recover(step, suspect=bool(again_at))
        if again_at:
            again = await self.rollout.run([tasks[i] for i in again_at])
            for i, g in zip(again_at, again, strict=True):
                groups[i] = g
            if any(engine_lost(tr) for g in again for tr in g):
                raise TrainingError(
                    f"step {step}: episodes lost their rollout server again after "
                    f"the restart (logs in {self.logs})"
                )
            self._check_sandbox([tr for i in again_at for tr in groups[i]], len(groups), step)
        return groups, {
            "engine/restarts": float(restarted),
            "sandbox/restarts": float(revived),
            "rollout/reissued": float(sum(len(groups[i]) for i in again_at)),
        }

    async def _revive_sandbox(self, step: int) -> int:
        """The sandbox service this run started is restarted if it died (its client also does
        so at the first refused call); returns the restarts since the last look. A service given
        by URL is not ours to restart; past `sandbox.max_restarts` the run stops."""
        sandbox = self.rollout.sandbox
        if not isinstance(sandbox, Revivable):
            return 0
        try:
            await sandbox.revive()
        except SandboxUnavailable as e:
            raise TrainingError(
                f"step {step}: {e}. Fix the cause, then resume with checkpoint.resume=auto"
            ) from None
        seen, self.sandbox_restarts = self.sandbox_restarts, sandbox.restarts
        return sandbox.restarts - seen

    def _check_sandbox(self, again: list[Trajectory], n_groups: int, step: int) -> None:
        """After the re-issue: episodes still without a sandbox past `max_unavailable_frac` of
        the step stop the run with the cause, rather than training on a step that silently lost
        them (they leave the baseline)."""
        still = [tr for tr in again if tr.stop_reason == StopReason.SANDBOX_UNAVAILABLE]
        total = max(1, n_groups * self.group_size)
        if still and len(still) / total > self.max_unavailable_frac:
            raise TrainingError(
                f"step {step}: {len(still)} of {total} episodes had no sandbox even "
                f"after their groups were rolled out again (trainer.guards.max_unavailable_frac="
                f"{self.max_unavailable_frac:g}). The sandbox service is down or "
                f"refusing calls: {still[0].error}. Fix it, then resume with checkpoint.resume=auto"
            )


def tasks_of(groups: Groups, launched: list[Task]) -> list[Task]:
    """The task of each kept group (groups come back in launch order, a subset when
    over-sampling)."""
    by_id: dict[str, list[Task]] = {}
    for t in launched:
        by_id.setdefault(t.id, []).append(t)
    return [by_id[g[0].task_id].pop(0) for g in groups]


class SyncGroups:
    """trainer.mode=sync: each step's groups rolled out when the step asks (module docstring).
    `keep`: dynamic sampling's test (None: off)."""

    concurrent = False

    def __init__(
        self,
        sampler: TaskSampler | MixtureSampler,
        rollout: Rollout | MixtureRollout,
        reissue: Reissue,
        per_step: int,
        oversample: int = 0,
        keep: Keep | None = None,
        max_refill_rounds: int = 0,
    ) -> None:
        self.sampler, self.rollout, self.reissue = sampler, rollout, reissue
        self.per_step, self.oversample = per_step, oversample
        self.keep, self.max_refill_rounds = keep, max_refill_rounds

    async def __aenter__(self) -> SyncGroups:
        return self

    async def __aexit__(self, *exc: object) -> None:
        return None

    async def take(self, step: int) -> tuple[Groups, dict[str, float]]:
        """Roll out this step's groups now (over-sampled: the first to finish)."""
        launched = self.sampler.next(self.per_step + self.oversample)
        groups = await self.rollout.run(launched, keep=self.per_step)
        groups, metrics = await self.reissue(tasks_of(groups, launched), groups, step)
        metrics["rollout/oversampled_dropped"] = float(len(launched) - len(groups))
        if self.keep is not None:
            groups, refill = await self.refill(groups, step)
            metrics.update(refill)
        return groups, metrics

    async def refill(self, groups: Groups, step: int) -> tuple[Groups, dict[str, float]]:
        """Dynamic sampling: keep the groups that carry gradient (`keep`), roll out more tasks
        until `per_step` do or `max_refill_rounds` extra rounds are spent. With none at all, the
        step keeps what it had (the no-signal warning then counts it). reward/*_all: over
        every group rolled out, the filtered ones too."""
        assert self.keep is not None
        seen = list(groups)
        kept = [g for g in groups if self.keep(g)]
        filtered, rounds = len(groups) - len(kept), 0
        while len(kept) < self.per_step and rounds < self.max_refill_rounds:
            tasks = self.sampler.next(self.per_step - len(kept))
            more, _ = await self.reissue(tasks, await self.rollout.run(tasks), step)
            good = [g for g in more if self.keep(g)]
            seen += more
            kept += good
            filtered += len(more) - len(good)
            rounds += 1
        return (kept or groups), {
            "rollout/filtered_groups": float(filtered),
            "rollout/refill_rounds": float(rounds),
            **sampled_reward_metrics(seen),
        }

    def advance(self, version: int) -> None:
        return None  # the next step rolls out with whatever the engines serve then

    def state_dict(self) -> dict[str, Any]:
        return {}  # nothing in flight between steps


class AsyncGroups:
    """trainer.mode=async: the producer's groups (agentrl/producer.py), re-issued where lost.
    `resumed`: the checkpoint's groups in flight (`state_dict`), handed on first."""

    concurrent = True

    def __init__(
        self,
        producer: GroupProducer,
        reissue: Reissue,
        per_step: int,
        resumed: dict[str, Any] | None = None,
    ) -> None:
        self.producer, self.reissue, self.per_step = producer, reissue, per_step
        self.resumed = resumed
        self.running = False  # inside `async with`: the producer launches groups

    async def __aenter__(self) -> AsyncGroups:
        if self.resumed is not None:  # the groups it had in flight
            self.producer.load_state(self.resumed)
        self.producer.start()
        self.running = True
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.producer.close()
        self.running = False

    async def take(self, step: int) -> tuple[Groups, dict[str, float]]:
        """The next finished groups within the staleness bound."""
        if not self.running:
            raise RuntimeError("AsyncGroups.take outside `async with` (no producer runs)")
        taken, metrics = await self.producer.take(self.per_step)
        groups = [g.trajectories for g in taken]
        groups, recovery = await self.reissue([g.task for g in taken], groups, step)
        return groups, {**metrics, **recovery, "rollout/oversampled_dropped": 0.0}

    def advance(self, version: int) -> None:
        self.producer.advance(version)  # the next groups may launch (none hangs)

    def state_dict(self) -> dict[str, Any]:
        return {"async": self.producer.state_dict()}
