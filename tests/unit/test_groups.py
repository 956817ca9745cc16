"""Where groups come from (agentrl/groups.py), with fakes: a scripted rollout, a stand-in for
the engines' restarts, a sampler of numbered tasks. The real rollouts are tests/e2e/test_train*.py
(sync, dynamic sampling, a killed engine) and tests/e2e/test_async.py."""

from __future__ import annotations

import asyncio
import math

import pytest

from agentrl.data import TaskSampler
from agentrl.groups import AsyncGroups, Reissue, SyncGroups
from agentrl.producer import GroupProducer
from agentrl.rollout import ENGINE_DOWN
from agentrl.types import (
    FinishReason,
    Message,
    StopReason,
    Task,
    TrainingError,
    Trajectory,
    Turn,
)

OK, SAND, ABORT = StopReason.COMPLETED, StopReason.SANDBOX_UNAVAILABLE, StopReason.ABORTED


def episode(task: str, i: int, reward: float, stop: StopReason = OK, error: str = "") -> Trajectory:
    turn = Turn(start=1, end=2, obs_end=2, weight_version="0", finish_reason=FinishReason.STOP,
                assistant=Message(role="assistant", content="x"))  # fmt: skip
    return Trajectory(task_id=task, sample_index=i, token_ids=[1, 2], loss_mask=[0, 1],
                      logprobs=[0.0, -1.0], prompt_len=1, turns=[turn], messages=[],
                      stop_reason=stop, reward=reward, error=error or None)  # fmt: skip


class Rollout:
    """Group i of task t: rewards from `rewards(t, attempt)`; records every call."""

    def __init__(self, rewards=lambda task, attempt: [1.0, 0.0], stops=None) -> None:
        self.rewards, self.stops = rewards, stops or (lambda task, attempt: [OK, OK])
        self.calls: list[list[str]] = []
        self.attempts: dict[str, int] = {}
        self.sandbox = None

    def group(self, task: Task) -> list[Trajectory]:
        n = self.attempts[task.id] = self.attempts.get(task.id, -1) + 1
        stops = self.stops(task.id, n)
        return [episode(task.id, i, r, s, ENGINE_DOWN if s == ABORT else "gone")
                for i, (r, s) in enumerate(zip(self.rewards(task.id, n), stops, strict=True))]  # fmt: skip

    async def run(self, tasks: list[Task], keep: int | None = None) -> list[list[Trajectory]]:
        self.calls.append([t.id for t in tasks])
        return [self.group(t) for t in tasks][:keep]

    async def run_group(self, task: Task) -> list[Trajectory]:
        return self.group(task)


class Engines:
    def __init__(self) -> None:
        self.calls: list[tuple[int, bool]] = []

    async def recover(self, step: int, suspect: bool) -> int:
        self.calls.append((step, suspect))
        return int(suspect)


def sampler() -> TaskSampler:
    return TaskSampler([Task(id=str(i), data={}) for i in range(50)], shuffle=False)


def reissue(rollout: Rollout, engines: Engines, max_unavailable: float = 0.0) -> Reissue:
    return Reissue(rollout, engines, group_size=2, max_unavailable_frac=max_unavailable, logs="out")  # type: ignore[arg-type]


async def test_sync_over_samples_and_keeps_the_first_groups():
    roll, engines = Rollout(), Engines()
    source = SyncGroups(sampler(), roll, reissue(roll, engines), per_step=2, oversample=1)  # type: ignore[arg-type]
    groups, m = await source.take(step=1)
    assert roll.calls == [["0", "1", "2"]] and [g[0].task_id for g in groups] == ["0", "1"]
    assert m == {"engine/restarts": 0.0, "sandbox/restarts": 0.0, "rollout/reissued": 0.0,
                 "rollout/oversampled_dropped": 1.0}  # fmt: skip
    assert engines.calls == [(1, False)]  # every rollout asks the engines about the dead
    assert not source.concurrent and source.state_dict() == {}


async def test_dynamic_sampling_refills_with_groups_that_carry_signal():
    flat = {"0", "2"}  # these tasks' groups have equal rewards
    roll = Rollout(rewards=lambda t, n: [1.0, 1.0] if t in flat else [1.0, 0.0])
    keep = lambda g: len({tr.reward for tr in g}) > 1  # noqa: E731
    source = SyncGroups(sampler(), roll, reissue(roll, Engines()), per_step=2, keep=keep,  # type: ignore[arg-type]
                        max_refill_rounds=2)  # fmt: skip
    groups, m = await source.take(step=1)
    assert [g[0].task_id for g in groups] == ["1", "3"]
    assert roll.calls == [["0", "1"], ["2"], ["3"]]
    assert m["rollout/filtered_groups"] == 2 and m["rollout/refill_rounds"] == 2
    assert m["reward/mean_all"] == pytest.approx((1 + 0.5 + 1 + 0.5) / 4)
    # an audit: reward/* covers the kept groups only (here all 0.5); the dropped ones count here
    assert m["reward/max_all"] == 1.0 and m["reward/min_all"] == 0.0
    assert m["reward/std_all"] == pytest.approx(math.sqrt(0.1875))  # rewards 1,1,1,0,1,1,1,0


async def test_a_group_that_lost_an_episode_to_its_engine_is_rolled_out_again_whole():
    roll = Rollout(stops=lambda t, n: [OK, ABORT] if (t, n) == ("1", 0) else [OK, OK])
    engines = Engines()
    source = SyncGroups(sampler(), roll, reissue(roll, engines), per_step=2)  # type: ignore[arg-type]
    groups, m = await source.take(step=3)
    assert roll.calls == [["0", "1"], ["1"]] and engines.calls == [(3, True)]
    assert all(tr.stop_reason == OK for g in groups for tr in g)
    assert m["engine/restarts"] == 1 and m["rollout/reissued"] == 2


async def test_lost_again_after_the_restart_stops_the_run():
    roll = Rollout(stops=lambda t, n: [OK, ABORT] if t == "1" else [OK, OK])
    source = SyncGroups(sampler(), roll, reissue(roll, Engines()), per_step=2)  # type: ignore[arg-type]
    with pytest.raises(TrainingError, match="step 1: episodes lost their rollout server again"):
        await source.take(step=1)


async def test_episodes_still_without_a_sandbox_past_the_bar_stop_the_run():
    roll = Rollout(stops=lambda t, n: [OK, SAND] if t == "0" else [OK, OK])
    source = SyncGroups(sampler(), roll, reissue(roll, Engines(), 0.2), per_step=2)  # type: ignore[arg-type]
    with pytest.raises(TrainingError, match=r"1 of 4 episodes had no sandbox"):
        await source.take(step=1)
    roll = Rollout(stops=lambda t, n: [OK, SAND] if t == "0" else [OK, OK])
    source = SyncGroups(sampler(), roll, reissue(roll, Engines(), 0.25), per_step=2)  # type: ignore[arg-type]
    groups, m = await source.take(step=1)  # at the bar: trained without it
    assert m["rollout/reissued"] == 2


async def test_async_groups_take_in_launch_order_and_checkpoint_what_is_in_flight():
    roll, engines = Rollout(), Engines()
    producer = GroupProducer(roll, sampler(), 2, 1, "wait", version=0)  # type: ignore[arg-type]
    source = AsyncGroups(producer, reissue(roll, engines), per_step=2)
    with pytest.raises(RuntimeError, match="outside `async with`"):
        await source.take(step=1)
    async with source:
        groups, m = await source.take(step=1)
        assert [g[0].task_id for g in groups] == ["0", "1"] and source.concurrent
        assert m["async/dropped"] == 0 and m["rollout/oversampled_dropped"] == 0
        source.advance(1)
        await asyncio.sleep(0.01)
        state = source.state_dict()["async"]
        pending = state["pending"]
        assert [p["task"]["id"] for p in pending] == ["2", "3", "4", "5"]
    resumed = GroupProducer(Rollout(), sampler(), 2, 1, "wait", version=1)  # type: ignore[arg-type]
    again = AsyncGroups(resumed, reissue(roll, Engines()), 2, resumed=state)
    async with again:
        groups, _ = await again.take(step=2)
    assert [g[0].task_id for g in groups] == ["2", "3"]  # the checkpoint's first, in order
