"""The async producer's bookkeeping (agentrl/producer.py): how far rollouts run ahead of the
learner (stale_policy=wait), what is dropped as too stale, and that nothing stale is handed on.
The rollout here is a stand-in whose groups finish when the test says and report the weight
version the test sets; the real rollout against a dev server is in tests/e2e/test_async.py."""

import asyncio

import pytest

from agentrl.data import TaskSampler
from agentrl.producer import GroupProducer, producing
from agentrl.types import (
    FinishReason,
    Message,
    StopReason,
    Task,
    TrainingError,
    Trajectory,
    Turn,
)


class Engines:
    """Groups finish when `release` is called; each turn reports `engine_version`."""

    def __init__(self) -> None:
        self.engine_version = 0
        self.started: list[str] = []
        self.gate = asyncio.Event()

    async def run_group(self, task: Task) -> list[Trajectory]:
        self.started.append(task.id)
        version = self.engine_version  # sampled with the weights of its launch
        await self.gate.wait()
        turn = Turn(start=1, end=2, obs_end=2, weight_version=str(version),
                    finish_reason=FinishReason.STOP, assistant=Message(role="assistant", content="x"))  # fmt: skip
        return [Trajectory(task_id=task.id, sample_index=0, token_ids=[1, 2], loss_mask=[0, 1],
                           logprobs=[0.0, -1.0], prompt_len=1, turns=[turn], messages=[],
                           stop_reason=StopReason.COMPLETED)]  # fmt: skip


def producer(engines: Engines, policy: str, staleness: int, per_step: int = 2) -> GroupProducer:
    tasks = [Task(id=str(i), data={"prompt": "p"}) for i in range(100)]
    sampler = TaskSampler(tasks, shuffle=False)
    return GroupProducer(engines, sampler, per_step, staleness, policy, version=0)


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


async def test_wait_policy_runs_at_most_max_staleness_versions_ahead():
    engines = Engines()
    async with producing(producer(engines, "wait", staleness=1)) as p:
        await settle()
        assert len(engines.started) == 4  # (0 updates + 1 + 1) x 2 per step
        engines.gate.set()
        groups, m = await p.take(2)
        assert [g.task.id for g in groups] == ["0", "1"] and m["async/staleness_max"] == 0
        await settle()
        assert len(engines.started) == 4  # no update yet: still waiting for the learner
        engines.engine_version = 1
        p.advance(1)
        await settle()
        assert len(engines.started) == 6
        groups, m = await p.take(2)  # launched at version 0, taken at version 1
        assert m["async/staleness_max"] == 1 and m["async/dropped"] == 0


async def test_groups_staler_than_the_bound_are_dropped_and_counted():
    engines = Engines()
    async with producing(producer(engines, "drop", staleness=0, per_step=1)) as p:
        await settle()
        assert len(engines.started) == 1
        p.advance(1)  # the learner moved on while the group was sampled with version 0
        engines.engine_version = 1
        engines.gate.set()
        groups, m = await p.take(1)
        assert m["async/dropped"] == 1  # the version-0 group; the next one is fresh
        assert m["async/staleness_max"] == 0 and groups[0].task.id == "1"


async def test_an_error_in_a_group_stops_the_take():
    class Broken(Engines):
        async def run_group(self, task):
            raise RuntimeError("template cannot render")

    async with producing(producer(Broken(), "wait", staleness=1)) as p:
        with pytest.raises(RuntimeError, match="template cannot render"):
            await asyncio.wait_for(p.take(1), 5)


async def test_a_version_that_is_not_ours_is_refused_loudly():
    engines = Engines()
    engines.engine_version = "default"
    engines.gate.set()
    async with producing(producer(engines, "wait", staleness=1)) as p:
        with pytest.raises(RuntimeError, match="not a number"):
            await p.take(1)


async def test_a_checkpoint_keeps_the_groups_in_flight_and_resume_hands_them_on_in_order():
    engines = Engines()
    async with producing(producer(engines, "wait", staleness=1)) as p:
        await settle()
        unfinished = p.state_dict()  # 4 launched, none finished: all to roll out again
        engines.gate.set()
        await p.take(2)
        await settle()
        finished = p.state_dict()  # groups 2 and 3 finished, not yet taken
    assert [g["task"]["id"] for g in unfinished["pending"]] == ["0", "1", "2", "3"]
    assert all(g["trajectories"] is None for g in unfinished["pending"])
    assert [g["task"]["id"] for g in finished["pending"]] == ["2", "3"]
    assert all(len(g["trajectories"]) == 1 for g in finished["pending"])

    again = Engines()
    again.gate.set()
    resumed = producer(again, "wait", staleness=1)
    resumed.sampler.next(4)  # the checkpoint's cursor is past every launched task
    resumed.load_state(finished)
    async with producing(resumed) as p:
        groups, _ = await p.take(2)
        assert [g.task.id for g in groups] == ["2", "3"]  # as they were: not rolled out again
        assert "2" not in again.started and "3" not in again.started
        groups, _ = await p.take(2)
        assert [g.task.id for g in groups] == ["4", "5"]  # then the sampler goes on

    relaunched = Engines()
    relaunched.gate.set()
    resumed = producer(relaunched, "wait", staleness=1)
    resumed.sampler.next(4)
    resumed.load_state(unfinished)
    async with producing(resumed) as p:
        groups, _ = await p.take(4)
        assert [g.task.id for g in groups] == ["0", "1", "2", "3"]
        assert relaunched.started[:4] == ["0", "1", "2", "3"]


async def test_dynamic_sampling_filters_groups_without_signal_and_launches_more():
    engines = Engines()
    engines.gate.set()
    p = producer(engines, "wait", staleness=0, per_step=2)
    p.keep = lambda trajs: trajs[0].task_id in {"1", "3", "4"}  # the others: "all rewards equal"
    async with producing(p):
        groups, m = await p.take(2)
    assert [g.task.id for g in groups] == ["1", "3"]
    assert m["rollout/filtered_groups"] == 2  # groups 0 and 2, each replaced by a new launch


async def test_dynamic_sampling_gives_up_when_no_group_carries_signal():
    """An audit: trainer.mode=async with dynamic sampling and a reward that was always 0 filtered
    groups for ever: no step was ever taken, nothing was said. As sync's refill rounds, the take
    gives up after per_step x (1 + refill_rounds) filtered groups and hands on the first ones
    (the trainer's no-signal warning then counts the step); their launch slots stay taken."""
    engines = Engines()
    engines.gate.set()
    p = producer(engines, "wait", staleness=0, per_step=2)
    p.keep, p.refill_rounds = (lambda trajs: False), 2
    async with producing(p):
        groups, m = await asyncio.wait_for(p.take(2), 5)
        assert [g.task.id for g in groups] == ["0", "1"]
        assert m["rollout/filtered_groups"] == 6  # 2 x (1 + 2) tried
        assert p.dropped == 4  # the two taken hold their launch slots: 6 filtered, 2 trained


async def test_an_engine_that_never_gets_the_new_weights_stops_the_take():
    """An audit: a weight push that never reached the engine (a transport of one's own that did
    not pass the version) left an async run sampling the first policy: after max_staleness steps
    every group was dropped as too stale and the run waited for ever without a word. A group
    launched after a push but sampled with older weights now stops the take, naming the cause."""
    engines = Engines()
    engines.gate.set()  # the engine stays at version 0 whatever is pushed
    async with producing(producer(engines, "wait", staleness=1)) as p:
        await p.take(2)
        p.advance(1)
        _, m = await p.take(2)  # launched before the push: sampled with version 0, as they should
        assert m["async/staleness_max"] == 1
        with pytest.raises(TrainingError, match="launched when the engines served policy "
                           "version 1 was sampled with version 0: a weight push did not"):  # fmt: skip
            await asyncio.wait_for(p.take(2), 5)


async def test_a_checkpoint_rolls_finished_groups_with_routes_out_again():
    """learner.routing_replay: a trajectory's record leaves its routes out, so a finished group
    kept in a checkpoint would resume without them and train on the learner's own experts:
    it is rolled out again instead. Before, it was handed on with routes None."""
    import numpy as np

    class Routed(Engines):
        async def run_group(self, task):
            trajs = await super().run_group(task)
            trajs[0].routes = np.zeros((1, 4), dtype=np.int32)  # [positions, layers * k]
            return trajs

    engines = Routed()
    engines.gate.set()
    async with producing(producer(engines, "wait", staleness=1)) as p:
        await p.take(2)
        await settle()
        state = p.state_dict()  # groups 2 and 3 finished, not yet taken
    assert [g["task"]["id"] for g in state["pending"]] == ["2", "3"]
    assert all(g["trajectories"] is None for g in state["pending"])
