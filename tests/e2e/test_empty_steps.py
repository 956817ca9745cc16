"""Steps with nothing to train on (every episode an infrastructure failure) are skipped alike in
both modes: the engines' weights keep their values but carry the next version, so async rollouts
go on within trainer.async.max_staleness (no hang), sync mode raises no false 'weight push did
not reach an engine' alarm, and trainer.guards.max_empty_steps stops a run that never recovers.
Real stack: dev server, sandbox, FSDP2 on Ray."""

import asyncio
import json
from pathlib import Path

import pytest

from agentrl.config import compose
from agentrl.data import TaskSampler
from agentrl.envs.code_exec import CodeExecEnv
from agentrl.sandbox.base import SandboxUnavailable
from agentrl.tracking import Tracker
from agentrl.train import TrainingError, train

pytestmark = pytest.mark.usefixtures("shared_ray")  # one Ray for the module's runs (conftest)

SMALL = ["trainer.tasks_per_step=2", "rollout.group_size=4", "rollout.max_new_tokens=48",
         "rollout.max_turns=2", "ray.num_cpus=2", "logging=local",
         "trainer.guards.max_unavailable_frac=1"]  # fmt: skip  # reach the empty-steps guard
HANG_S = 90  # a hung run is stopped here and fails the test

DOWN: set[str] = set()  # the tasks whose episodes find no sandbox (set by each test)


class NoSandboxEnv(CodeExecEnv):
    """Infrastructure down for every episode: nothing to train on."""

    async def start(self):
        raise SandboxUnavailable("sandbox down (test)")


class DownForSomeTasksEnv(CodeExecEnv):
    """No sandbox for the tasks in DOWN (their re-issue too), a working one for the others."""

    async def start(self):
        if self.task.id in DOWN:
            raise SandboxUnavailable("sandbox down (test)")
        return await super().start()


def cfg_for(tmp: Path, env: str, *extra: str):
    return compose([*SMALL, f"checkpoint.dir={tmp}/ckpt", f"env._target_={__name__}.{env}", *extra])


def first_tasks(cfg, n: int) -> set[str]:
    """The ids of the first `n` tasks the run's sampler hands out."""
    tasks = cfg.env.load_tasks(cfg.env.load_class())
    return {t.id for t in TaskSampler(tasks, seed=cfg.seed).next(n)}


def run(cfg, out: Path):
    return asyncio.run(asyncio.wait_for(train(cfg, out), HANG_S))


def rows(out: Path, name: str) -> list[dict]:
    return [json.loads(x) for x in (out / name).read_text().splitlines()]


def test_async_empty_steps_past_the_staleness_bound_stop_the_run_not_hang(tmp_path):
    # max_staleness=1: before the fix the launch budget ran out after 2 skipped steps and the
    # third waited for a group that was never launched
    cfg = cfg_for(tmp_path, "NoSandboxEnv", "trainer.mode=async", "trainer.async.stale_policy=wait",
                  "trainer.async.max_staleness=1", "trainer.guards.max_empty_steps=3",
                  "trainer.steps=5")  # fmt: skip
    with pytest.raises(TrainingError, match="3 steps in a row had no trajectory to train on"):
        run(cfg, tmp_path / "out")
    got = rows(tmp_path / "out", "metrics.jsonl")
    assert [r["train/empty_steps_in_a_row"] for r in got] == [1.0, 2.0]


def test_async_run_recovers_after_empty_steps_within_the_staleness_bound(tmp_path):
    cfg = cfg_for(tmp_path, "DownForSomeTasksEnv", "trainer.mode=async", "trainer.steps=4",
                  "trainer.async.stale_policy=wait", "trainer.async.max_staleness=1")  # fmt: skip
    DOWN.clear()
    DOWN.update(first_tasks(cfg, 2 * 2))  # steps 1 and 2: all their groups
    history = run(cfg, tmp_path / "out")
    assert [h["step"] for h in history] == [1.0, 2.0, 3.0, 4.0]
    assert [h["train/empty_steps_in_a_row"] for h in history] == [1.0, 2.0, 0.0, 0.0]
    assert all("train/loss" in h for h in history[2:])
    assert max(h["async/staleness_max"] for h in history) <= 1
    for row in rows(tmp_path / "out", "trajectories.jsonl"):  # every trained token in the bound
        for turn in row["turns"]:
            assert 0 <= int(row["step"]) - 1 - int(turn["weight_version"]) <= 1, row["step"]


def test_sync_skipped_step_raises_no_false_push_alarm(tmp_path, capsys, caplog, monkeypatch):
    cfg = cfg_for(tmp_path, "DownForSomeTasksEnv", "trainer.steps=3")
    DOWN.clear()
    DOWN.update(first_tasks(cfg, 2))  # step 1: both its groups
    alerts: list[str] = []  # the W&B alerts' titles
    monkeypatch.setattr(Tracker, "alert", lambda self, title, text: alerts.append(title))
    history = run(cfg, tmp_path / "out")
    assert [h["train/empty_steps_in_a_row"] for h in history] == [1.0, 0.0, 0.0]
    assert [h["rollout/off_version_turns"] for h in history] == [0.0, 0.0, 0.0]
    assert "engine serves old weights" not in alerts
    assert "did not reach an engine" not in capsys.readouterr().out + caplog.text
    # step 2 sampled with the weights after step 1: unchanged, under version 1
    step2 = [r for r in rows(tmp_path / "out", "trajectories.jsonl") if r["step"] == 2]
    assert step2 and {t["weight_version"] for r in step2 for t in r["turns"]} == {"1"}
