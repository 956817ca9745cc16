"""trainer.deterministic's sampling seeds (agentrl/seeding.py): each engine request's seed follows
from its place in the run (seed, round, task, group slot, sample, turn), never from the order in
which episodes happen to finish; outside a round requests carry none. And the settings it refuses."""

from __future__ import annotations

import asyncio
import random
from collections import defaultdict

import pytest

from agentrl.config import compose
from agentrl.env import Env, StepResult
from agentrl.rollout import Rollout, RolloutConfig
from agentrl.seeding import SEED_BITS, sampling_round
from agentrl.types import Completion, ConfigError, FinishReason, Message, Task


class Talk(Env):
    """Two turns, no tools."""

    max_turns = 2

    async def start(self):
        return [Message(role="user", content=self.task.data["prompt"])]

    async def step(self, turn):
        return StepResult(messages=[Message(role="user", content="and then?")])

    async def reward(self, trajectory):
        return 0.0


class Recorder:
    """Answers every request after a random delay; records each one's seed by (task id, sample
    index, turn)."""

    def __init__(self, tokenizer, delays: int) -> None:
        self.ids = tokenizer.encode("ok", add_special_tokens=False) + [tokenizer.eos_token_id]
        self.rng = random.Random(delays)
        self.turns: dict[str, int] = defaultdict(int)
        self.seeds: dict[tuple[str, int, int], list[int | None]] = defaultdict(list)

    async def generate(self, input_ids, params, key=None):
        await asyncio.sleep(self.rng.random() * 0.02)  # finish in another order each time
        task_id, sample, _ = key.split(":")
        turn = self.turns[key]
        self.turns[key] += 1
        self.seeds[(task_id, int(sample), turn)].append(params.seed)
        return Completion(list(self.ids), [-0.5] * len(self.ids), FinishReason.STOP)


TASKS = [Task(id=i, data={"prompt": f"task {i}"}) for i in ("a", "b", "a")]  # "a" in two slots


async def seeds(tokenizer, delays: int, name: str | None) -> dict:
    engine = Recorder(tokenizer, delays)
    rollout = Rollout(engine, tokenizer, Talk, RolloutConfig(group_size=2))
    with sampling_round(None if name is None else 0, name or ""):
        groups = await rollout.run(TASKS)
    assert [len(g[0].turns) for g in groups] == [2, 2, 2]
    return {k: sorted(v, key=str) for k, v in engine.seeds.items()}


async def test_seeds_follow_each_requests_place_not_the_timing(qwen_tokenizer):
    first = await seeds(qwen_tokenizer, delays=1, name="step 1")
    assert first == await seeds(qwen_tokenizer, delays=2, name="step 1")
    every = [s for v in first.values() for s in v]
    assert len(every) == 3 * 2 * 2 and len(set(every)) == len(every)  # task "a" twice: apart
    assert all(0 <= s < 1 << SEED_BITS for s in every)
    later = await seeds(qwen_tokenizer, delays=1, name="step 2")
    assert not set(every) & {s for v in later.values() for s in v}
    unseeded = await seeds(qwen_tokenizer, delays=1, name=None)
    assert {s for v in unseeded.values() for s in v} == {None}


@pytest.mark.parametrize(
    "setting, why",
    [("trainer.mode=async", "needs trainer.mode=sync"),
     ("trainer.sampling.oversample_groups=2", "first to finish")],
)  # fmt: skip
def test_deterministic_refuses_what_follows_timing(setting, why):
    compose([setting])  # fine alone
    with pytest.raises(ConfigError, match=why):
        compose(["trainer.deterministic=true", setting])
