"""env=mixture end to end on CPU: code_exec and a user's own env (the README's AddEnv, saved to
the test's tmp dir as a user would) trained in one run for 2 steps, with an evaluation before the
first step and after the last: every step draws groups of both envs (seed 0: add, code; then
code, add), each with its own tools, and the run reports each env apart (env/<name>/*,
eval/<name>/*) beside the totals; every trajectory names its env."""

import asyncio
import json
from pathlib import Path

import pytest

from agentrl.config import compose
from agentrl.train import train

pytestmark = pytest.mark.usefixtures("shared_ray")  # one Ray for the module's runs (conftest)


def rows(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines()]


def test_a_mixture_of_code_exec_and_a_users_env_trains_with_each_env_apart(readme_env, tmp_path):
    cfg = compose([
        "env=mixture", "~env.envs.units", "+env@env.envs.add=custom",
        f"env.envs.add._target_={readme_env}", "env.envs.add.tasks.n=40",
        "trainer.steps=2", "trainer.tasks_per_step=2", "rollout.group_size=2",
        "rollout.max_new_tokens=48", "rollout.max_turns=2", "ray.num_cpus=2",
        "trainer.eval.every=2", "trainer.eval.size=2", "trainer.eval.samples=1",
        f"checkpoint.dir={tmp_path}/ckpt",
    ])  # fmt: skip
    history = asyncio.run(train(cfg, tmp_path / "out"))
    assert len(history) == 2
    for h in history:  # both envs each step, the totals over both
        assert h["env/code/groups"] == h["env/add/groups"] == 1
        assert h["env/code/trajectories"] == h["env/add/trajectories"] == 2
        assert h["rollout/trajectories"] == 4 and h["train/skipped"] == 0
        for name in ("code", "add"):
            assert 0 <= h[f"env/{name}/reward_mean"] <= 1 and f"env/{name}/tool_call_rate" in h
        together = (h["env/code/reward_mean"] + h["env/add/reward_mean"]) / 2
        assert h["reward/mean"] == pytest.approx(together)
    trained = rows(tmp_path / "out" / "trajectories.jsonl")
    for r in trained:  # each episode played by its own env: its task, its system prompt
        env = r["metadata"]["env"]
        assert r["task_id"].startswith(f"{env}/")
        system = r["messages"][0]["content"]
        assert ("Use the add tool" in system) == (env == "add") and ("python" in system) == (
            env == "code"
        )
    assert [r["metadata"]["env"] for r in trained if r["step"] == 1][::2] == ["add", "code"]
    evals = {int(r["step"]): r for r in rows(tmp_path / "out" / "metrics.jsonl")
             if "eval/reward_mean" in r}  # fmt: skip
    assert sorted(evals) == [0, 2]  # the untrained policy, and after the last step
    for r in evals.values():  # each env's own held-out 2 tasks x 1 sample, and all 4 together
        assert r["eval/episodes"] == 4 and r["eval/code/episodes"] == r["eval/add/episodes"] == 2
        assert r["eval/reward_mean"] == pytest.approx(
            (r["eval/code/reward_mean"] + r["eval/add/reward_mean"]) / 2
        )
    episodes = rows(tmp_path / "out" / "eval_trajectories.jsonl")
    assert sorted(r["metadata"]["env"] for r in episodes if r["step"] == 2) == ["add", "add",
                                                                               "code", "code"]  # fmt: skip
