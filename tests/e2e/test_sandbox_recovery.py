"""A sandbox service SIGKILLed mid-run: the run restarts it and rolls the groups that lost an
episode out again (the same tasks as a run whose service never died), or, past
`sandbox.max_restarts`, stops with the cause; never "done" over silently degraded steps."""

from __future__ import annotations

import asyncio
import copy
import json
import os
import signal
from pathlib import Path

import pytest

from agentrl.config import compose
from agentrl.run import open_run
from agentrl.train import Trainer, TrainingError

pytestmark = pytest.mark.usefixtures("shared_ray")  # one Ray for the module's runs (conftest)

SMALL = ["trainer.tasks_per_step=2", "rollout.group_size=4", "rollout.max_new_tokens=48",
         "rollout.max_turns=2", "ray.num_cpus=2", "+env.args.format_reward=0.5",
         "rollout.temperature=1.0",
         # seeded: the killer fires on a call reaching the service, so steps 2 and 3 must make
         # tool calls; unseeded, about 1 run in 10 drew a step without one (seed 1: 3 calls)
         "trainer.deterministic=true", "seed=1"]  # fmt: skip


def _tasks_per_step(path: Path) -> list[list[str]]:
    by_step: dict[int, set[str]] = {}
    for line in path.read_text().splitlines():
        row = json.loads(line)
        by_step.setdefault(row["step"], set()).add(row["task_id"])
    return [sorted(v) for _, v in sorted(by_step.items())]


def _kill_on_first_call(sandbox) -> list[bool]:
    """From now on, the first call made through the run's sandbox client SIGKILLs its service
    (the whole process group), then goes on, and fails as any call to a dead service does.
    Inside the call path, so the kill falls in the step whatever the machine's load (a poller
    raced quick steps on a busy machine and killed after them). Returns whether it fired."""
    fired: list[bool] = []
    run = type(sandbox).run

    async def killing_run(*args, **kwargs):
        if not fired:
            fired.append(True)
            os.killpg(sandbox._owner.proc.pid, signal.SIGKILL)
        return await run(sandbox, *args, **kwargs)

    sandbox.run = killing_run
    return fired


async def _run(cfg, out: Path, kill_at: set[int], history: list, handed: list) -> None:
    """Run the steps, killing the service during those in `kill_at`; appends each step's metrics
    to `history` and the tasks it was handed (what a run whose service never died would have
    rolled out) to `handed`."""
    async with open_run(cfg, out) as run:
        tr = Trainer(cfg, run)
        for step in range(1, cfg.trainer.steps + 1):
            handed.append(sorted(t.id for t in copy.deepcopy(run.sampler).next(2)))
            sandbox = run.rollout.sandbox
            fired = _kill_on_first_call(sandbox) if step in kill_at else [True]
            try:
                history.append(await tr.step())
            finally:
                vars(sandbox).pop("run", None)
                assert fired, f"step {step} made no tool call: nothing to kill it in"


def test_a_killed_sandbox_service_is_restarted_and_its_groups_reissued_then_the_run_stops(
    tmp_path,
):
    """Killed in step 2: restarted, the groups that lost an episode rolled out again. Killed again
    in step 3, past sandbox.max_restarts=1: the run stops with the cause."""
    cfg = compose([*SMALL, "trainer.steps=3", "sandbox.max_restarts=1", "sandbox.retries=1",
                   f"checkpoint.dir={tmp_path}/ckpt"])  # fmt: skip
    history: list[dict] = []
    handed: list[list[str]] = []
    with pytest.raises(TrainingError, match=r"sandbox service[\s\S]*died[\s\S]*resume"):
        asyncio.run(_run(cfg, tmp_path / "out", {2, 3}, history, handed))
    assert len(history) == 2, "the run stopped before step 3"
    first, m = history
    assert first["sandbox/restarts"] == 0
    assert m["sandbox/restarts"] == 1, m
    assert m["stop/sandbox_unavailable"] == 0 and m["rollout/trajectories"] == 8, m
    # the same tasks each step as a run whose service never died
    assert _tasks_per_step(tmp_path / "out" / "trajectories.jsonl") == handed[:2]
