"""trainer.deterministic=true: the same command run twice on CPU gives the same metrics, step by
step (every metric but the timings, `agentrl.metrics.is_timing`), the evaluations' included, and
samples the same tokens with the same logprobs (trajectories.jsonl). A server that batches
requests (started without --enable-deterministic-inference) is refused by name."""

import asyncio
import json
from pathlib import Path

import pytest

from agentrl.config import compose
from agentrl.engine import EngineClient
from agentrl.engine.checks import check_deterministic
from agentrl.metrics import is_timing
from agentrl.train import train
from agentrl.types import ConfigError

SMALL = ["trainer.tasks_per_step=2", "rollout.group_size=4", "rollout.max_new_tokens=48",
         "rollout.max_turns=2", "ray.num_cpus=2", "+env.args.format_reward=0.5",
         "trainer.steps=3", "checkpoint.every=0", "trainer.eval.every=3", "trainer.eval.size=2",
         "trainer.eval.samples=2", "logging=local", "trainer.deterministic=true"]  # fmt: skip


def run(tmp: Path) -> tuple[list[dict[str, float]], list[tuple]]:
    """One run's metrics.jsonl rows (the step-0 evaluation's too), timings left out, and what
    each episode sampled."""
    asyncio.run(train(compose([*SMALL, f"checkpoint.dir={tmp}/ckpt"]), tmp / "out"))
    rows = [json.loads(x) for x in (tmp / "out" / "metrics.jsonl").read_text().splitlines()]
    episodes = [
        json.loads(x) for x in (tmp / "out" / "trajectories.jsonl").read_text().splitlines()
    ]
    sampled = [(e["step"], e["task_id"], e["sample_index"], e["token_ids"], e["logprobs"])
               for e in episodes]  # fmt: skip
    return [{k: v for k, v in r.items() if not is_timing(k)} for r in rows], sampled


@pytest.mark.usefixtures("shared_ray")  # one Ray for both runs (conftest)
def test_the_same_command_twice_gives_the_same_metrics_step_by_step(tmp_path):
    first, first_sampled = run(tmp_path / "a")
    second, second_sampled = run(tmp_path / "b")
    assert [r["step"] for r in first] == [0, 1, 2, 3]  # the step-0 evaluation, then the steps
    for a, b in zip(first, second, strict=True):
        assert a == b, {
            k: (a.get(k), b.get(k)) for k in a.keys() | b.keys() if a.get(k) != b.get(k)
        }
    assert first_sampled == second_sampled and len(first_sampled) == 3 * 2 * 4
    steps = first[1:]
    assert all(r["rollout/prefix_cache_hit"] == 0 for r in steps)  # each request computed alone
    assert "eval/reward_mean" in first[0] and "eval/reward_mean" in steps[-1]
    assert any(r["train/grad_norm"] > 0 for r in steps)  # the weights moved between steps


async def test_a_server_started_without_the_flag_is_refused(devserver):
    """Servers given by engine.urls must compute each request alone; one that batches is named."""
    async with EngineClient([devserver]) as engine:
        with pytest.raises(ConfigError, match=f"{devserver}.*--enable-deterministic-inference"):
            await check_deterministic(engine)
