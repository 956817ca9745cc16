"""Asynchronous rollouts (`trainer.mode=async`): rollouts run on while the learner trains.

A `GroupProducer` keeps launching groups (one task x rollout.group_size episodes each) in the
background while the trainer scores, updates and pushes weights; each trainer step takes the next
`tasks_per_step` groups in launch order (waiting only for those still running).

Weight versions: the policy version is the number of trainer steps done (the version the engines
report for tokens sampled with those weights, `Turn.weight_version`). A step with nothing to train
on changes no weight yet moves the version on too (the engines relabel the same weights,
`Handover.relabel`, agentrl/handover.py), so the launch budget below never waits for a push that will not come, and a
staleness counted in versions is at least the number of updates since the token was sampled. A
group's staleness, when a step takes it, is the current version minus the oldest version any of
its turns was sampled with. `trainer.async.max_staleness` bounds it:

- stale_policy=wait (default): the producer launches a group only while
  launched < (steps + max_staleness + 1) x tasks_per_step (counted from this process's start),
  so rollouts run at most max_staleness versions ahead of the learner and then wait for it;
- stale_policy=drop: the producer keeps (max_staleness + 1) x tasks_per_step groups launched and
  not yet taken, whatever the learner's pace, and groups too stale when taken are dropped;
- in both, a group too stale when taken is dropped, counted in `async/dropped`; nothing older
  than max_staleness is ever trained.

Weight updates while episodes are in flight (`EngineClient.exclusive`): new turns wait for the
push; the turns in flight are cut (/abort_request, then /pause_generation) and go on under the
new weights (`trainer.async.partial_rollouts`, agentrl/gate.py: each token keeps the version that
sampled it, `Turn.segments`), or the push waits for them (`sync/drain_s`). A trajectory may mix
versions within and across turns; its staleness counts from its oldest token. The learner scores
every trained token with the weights about to be updated (the proximal policy of decoupled PPO),
and the engine's own logprobs weight it through the rollout correction (TIS/MIS, `algo.loss`).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from agentrl.data import TaskSampler
from agentrl.metrics import sampled_reward_metrics
from agentrl.rollout import Rollout
from agentrl.types import Task, TrainingError, Trajectory

log = logging.getLogger(__name__)


@dataclass
class FinishedGroup:
    task: Task
    trajectories: list[Trajectory]
    launched_at: int  # the policy version when the group was launched


def oldest_version(trajs: list[Trajectory], fallback: int) -> int:
    """The oldest weight version any turn of these trajectories was sampled with."""
    versions = []
    for tr in trajs:
        for turn in tr.turns:
            try:
                versions.append(int(turn.weight_version))
            except ValueError:
                raise RuntimeError(
                    f"episode {tr.task_id}:{tr.sample_index}: the engine reported weight version "
                    f"{turn.weight_version!r}, not a number; async training needs the versions "
                    "agentrl sets (is another process updating the server's weights?)"
                ) from None
    return min(versions, default=fallback)


def served_old_weights(g: FinishedGroup, sampled_at: int) -> str:
    """The error for a group sampled with older weights than the engines had when it was
    launched (every push completes before the producer's version moves on): a push did not reach
    an engine. An audit's transport that did not pass the version on let an async run sample the
    first policy for ever: after max_staleness steps every group was dropped as too stale, and
    the run waited for a fresh one without a word."""
    return (
        f"task {g.task.id!r}: a group launched when the engines served policy version "
        f"{g.launched_at} was sampled with version {sampled_at}: a weight push did not reach an "
        "engine, so it samples an old policy (and its groups would be dropped as too stale for "
        "ever). Check the sync/* metrics and the engine logs; a weight_sync transport of your own "
        "must pass weight_version to the engine's update call"
    )


class GroupProducer:
    def __init__(
        self,
        rollout: Rollout,
        sampler: TaskSampler,
        per_step: int,
        max_staleness: int,
        policy: str,
        version: int,
        keep: Callable[[list[Trajectory]], bool] | None = None,
        refill_rounds: int = 3,
    ) -> None:
        self.rollout, self.sampler = rollout, sampler
        self.per_step, self.max_staleness, self.policy = per_step, max_staleness, policy
        self.version = self.start_version = version
        self.keep = keep  # dynamic sampling: groups it refuses are filtered and replaced
        # … up to per_step x (1 + refill_rounds) filtered groups a take, as sync's refill rounds
        self.refill_rounds = refill_rounds
        self.launched = self.dropped = 0
        self.running: set[asyncio.Task] = set()
        self.order: collections.deque[asyncio.Future] = collections.deque()  # launch order
        self._tasks: dict[asyncio.Future, Task] = {}  # each launched group's task
        self._wake = asyncio.Event()
        self._loop_task: asyncio.Task | None = None
        self._error: BaseException | None = None

    # -- the trainer's side --------------------------------------------------------------------

    def start(self) -> None:
        self._loop_task = asyncio.ensure_future(self._launch_loop())

    def advance(self, version: int) -> None:
        """The learner's weights reached `version` (pushed to the engines)."""
        self.version = version
        self._wake.set()

    async def take(self, n: int) -> tuple[list[FinishedGroup], dict[str, float]]:
        """The next `n` groups in launch order, no staler than max_staleness, and the async
        metrics of this take. Launch order, not finishing order: taking whichever finished first
        would train the quick episodes (often the ones that skipped the tool) before the slow
        ones and bias every step towards them; in launch order the learner waits only for the
        oldest group while the younger ones keep rolling out."""
        kept: list[FinishedGroup] = []
        seen: list[list[Trajectory]] = []  # dynamic sampling: kept and filtered groups
        flat: list[FinishedGroup] = []  # dynamic sampling: the filtered ones
        dropped = 0
        while len(kept) < n and len(flat) < n * (1 + self.refill_rounds):
            if self._error is not None:
                raise self._error
            if self._loop_task is not None and self._loop_task.done():
                err = None if self._loop_task.cancelled() else self._loop_task.exception()
                raise err or RuntimeError("the rollout producer stopped")
            if not self.order:  # all dropped or not launched yet: let the launch loop run
                self._wake.set()
                await asyncio.sleep(0.01)
                continue
            oldest = self.order[0]
            watch = [oldest] + ([self._loop_task] if self._loop_task is not None else [])
            await asyncio.wait(watch, return_when=asyncio.FIRST_COMPLETED)
            if not oldest.done():
                continue  # the launch loop ended: its error is raised above
            self.order.popleft()
            self._tasks.pop(oldest, None)
            self._wake.set()  # stale_policy=drop counts the groups not yet taken
            if oldest.cancelled() or oldest.exception() is not None:
                continue  # recorded by _finished: raised above
            g = oldest.result()
            sampled_at = oldest_version(g.trajectories, g.launched_at)
            if sampled_at < g.launched_at:
                raise TrainingError(served_old_weights(g, sampled_at))
            if self.version - sampled_at > self.max_staleness:
                dropped += 1
                self.dropped += 1  # a dropped group frees a launch slot (stale_policy=wait)
                continue
            seen.append(g.trajectories)
            if self.keep is not None and not self.keep(g.trajectories):
                flat.append(g)
                self.dropped += 1  # … and so does a filtered one
                continue
            kept.append(g)
        filtered = len(flat)
        if not kept:  # none carried gradient: the step takes the first ones (`give_up`)
            kept = self.give_up(flat[:n])
        extra = sampled_reward_metrics(seen) if self.keep is not None else {}
        return kept, {**extra, **self.metrics(kept), "async/dropped": float(dropped),
                      "rollout/filtered_groups": float(filtered)}  # fmt: skip

    def metrics(self, kept: list[FinishedGroup]) -> dict[str, float]:
        """A take's staleness, partial turns, and the groups queued and in flight."""
        stale = [
            self.version - oldest_version([tr], g.launched_at)
            for g in kept
            for tr in g.trajectories
        ]
        return {
            "async/staleness_mean": sum(stale) / max(len(stale), 1),
            "async/staleness_max": float(max(stale, default=0)),
            "async/partial_turns": float(
                sum(bool(t.segments) for g in kept for tr in g.trajectories for t in tr.turns)
            ),
            "async/queued": float(sum(t.done() for t in self.order)),
            "async/in_flight": float(len(self.running)),
        }

    def give_up(self, flat: list[FinishedGroup]) -> list[FinishedGroup]:
        """Dynamic sampling found no group with signal in per_step x (1 + refill_rounds)
        groups: the step takes `flat`, as a sync step keeps its groups after its last refill
        round, and the no-signal warning counts it. Without a bound, an async run whose every
        reward was equal (a task too hard, a broken reward) filtered groups for ever and never
        took a step, without a word (an audit)."""
        self.dropped -= len(flat)  # trained on after all: they hold their launch slots
        return flat

    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint keeps of the work in flight: every group launched and not yet
        taken, in launch order, with its trajectories when it has finished (None: to roll out
        again on resume). The sampler's cursor is already past all of them. A finished group
        with routes (learner.routing_replay) is rolled out again too: a trajectory's record
        leaves its routes out (`Trajectory.to_dict`), and handed on without them the learner's
        router would choose the experts of every one of its tokens, not the engine's."""
        pending = []
        for run in self.order:
            done = run.done() and not run.cancelled() and run.exception() is None
            g: FinishedGroup | None = run.result() if done else None
            if g is not None and any(t.routes is not None for t in g.trajectories):
                g = None
            task = g.task if g is not None else self._tasks[run]
            pending.append({
                "task": task.model_dump(),
                "launched_at": g.launched_at if g is not None else self.version,
                "trajectories": [t.to_dict() for t in g.trajectories] if g is not None else None,
            })  # fmt: skip
        return {"pending": pending}

    def load_state(self, state: dict[str, Any]) -> None:
        """Before start(): the checkpoint's pending groups come first, in their launch order;
        finished ones are handed on as they were, unfinished ones are rolled out again."""
        loop = asyncio.get_running_loop()
        for item in state.get("pending", []):
            task = Task.model_validate(item["task"])
            if item["trajectories"] is not None:
                run: asyncio.Future = loop.create_future()
                trajs = [Trajectory.from_dict(t) for t in item["trajectories"]]
                run.set_result(FinishedGroup(task, trajs, item["launched_at"]))
                self._tasks[run] = task
                self.order.append(run)
                self.launched += 1
            else:
                self._launch(task)

    async def close(self) -> None:
        """Stop launching; cancel the groups in flight (their generations are aborted on the
        engine and their envs closed by the Rollout)."""
        tasks = [t for t in (self._loop_task, *self.running) if t is not None]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self.running.clear()
        self.order.clear()
        self._tasks.clear()

    # -- the background side -------------------------------------------------------------------

    def _may_launch(self) -> bool:
        if self.policy == "wait":
            steps = self.version - self.start_version  # done, skipped ones too
            budget = (steps + self.max_staleness + 1) * self.per_step
            return self.launched - self.dropped < budget
        return len(self.order) < (self.max_staleness + 1) * self.per_step

    async def _launch_loop(self) -> None:
        while True:
            while self._may_launch():
                self._launch(*self.sampler.next(1))
            self._wake.clear()
            await self._wake.wait()

    def _launch(self, task: Task) -> None:
        """Roll out one group of `task` in the background, taken in launch order."""
        run = asyncio.ensure_future(self._one(task, self.version))
        self.running.add(run)
        run.add_done_callback(self._finished)
        self._tasks[run] = task
        self.order.append(run)
        self.launched += 1

    async def _one(self, task: Task, version: int) -> FinishedGroup:
        return FinishedGroup(task, await self.rollout.run_group(task), version)

    def _finished(self, run: asyncio.Task) -> None:
        self.running.discard(run)
        if run.cancelled():
            return
        err = run.exception()
        if err is not None and self._error is None:
            self._error = err  # a bug to stop on (a template or config error): take() raises it
            if self._loop_task is not None:
                self._loop_task.cancel()
        self._wake.set()


@contextlib.asynccontextmanager
async def producing(producer: GroupProducer):
    producer.start()
    try:
        yield producer
    finally:
        await producer.close()
