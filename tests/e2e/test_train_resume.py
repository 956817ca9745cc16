"""A killed `python -m agentrl.train` resumes from its last checkpoint with the same data order,
sync and async (split from test_train.py so that xdist spreads the runs)."""

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from train_kit import ROOT, overrides, steps_of

from agentrl.config import compose
from agentrl.run import env_classes, samplers
from agentrl.train import train

pytestmark = pytest.mark.usefixtures("shared_ray")  # one Ray for the module's runs (conftest)


def _train_cmd(tmp: Path, out: str, steps: int, *extra: str) -> list[str]:
    return [sys.executable, "-m", "agentrl.train", *overrides(tmp, f"trainer.steps={steps}",
            "checkpoint.every=1", f"hydra.run.dir={tmp}/{out}", *extra)]  # fmt: skip


@pytest.mark.parametrize("mode,kill", [("sync", "writing"), ("async", "committed")])
def test_killed_run_resumes_with_the_same_data_order(mode, kill, tmp_path, capsys):
    """Also in async mode, where a checkpoint holds the groups in flight (finished ones as they
    were, unfinished ones rolled out again on resume): nothing lost, nothing trained twice. And
    killed while step 2's checkpoint is being written behind step 3 (checkpoint.async_save): the
    run resumes from step 1's. The async run is stopped as Ctrl-C stops it (SIGINT to the
    process group): one line says where it stands and how to go on, no traceback. The killed run
    is `python -m agentrl.train`; the resumed one runs in the test's process."""
    run_dir = tmp_path / "run"
    extra = [f"trainer.mode={mode}"]
    # what the run never killed trains, step by step: its sampler's draws, in order (a run that
    # is never killed trains exactly these, sync and async: it was checked against one here
    # before this test stopped paying for a third run; the settings are _train_cmd's)
    ref_cfg = compose(overrides(tmp_path / "ref", "trainer.steps=3", "checkpoint.every=1", *extra))
    sampler, _, _ = samplers(ref_cfg, env_classes(ref_cfg))
    ref = [sorted({t.id for t in sampler.next(ref_cfg.trainer.tasks_per_step)}) for _ in range(3)]
    # the same run, SIGKILLed (whole process group) once step 1 is checkpointed …
    log = tmp_path / "killed.log"
    proc = subprocess.Popen(_train_cmd(run_dir, "out", 3, *extra), cwd=ROOT,
                            start_new_session=True, stdout=log.open("w"), stderr=subprocess.STDOUT,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
                            )  # fmt: skip
    latest, staging = run_dir / "ckpt" / "latest", run_dir / "ckpt" / ".tmp"

    def ready() -> bool:
        if kill == "writing":  # … or while step 2's checkpoint is staged, not yet committed
            return any(staging.glob("step_00000002-*"))
        return latest.exists() and latest.read_text().strip() >= "step_00000001"

    deadline = time.monotonic() + 300
    while not ready():
        assert proc.poll() is None and time.monotonic() < deadline, "run ended before step 1"
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL if kill == "writing" else signal.SIGINT)
    proc.wait(60)
    if kill == "committed":  # Ctrl-C
        out = log.read_text()
        assert proc.returncode == 130, out[-3000:]
        assert "interrupted: the last checkpoint is step" in out and "resumes from it" in out
        assert "Traceback" not in out and "Unclosed" not in out, out[-3000:]
    if kill == "writing":
        assert latest.read_text().strip() == "step_00000001"
        assert not (run_dir / "ckpt" / "step_00000002").exists()
    # … then started again: it resumes from its last complete checkpoint, in the same run dir.
    # In this process, on the shared Ray (the killed run was the command; a Python and a Ray
    # start fewer): the same config _train_cmd gives, the same output dir
    capsys.readouterr()
    again = compose(overrides(run_dir, "trainer.steps=3", "checkpoint.every=1", *extra))
    asyncio.run(train(again, run_dir / "out"))
    said = " ".join(capsys.readouterr().out.split())  # the console wraps long lines
    assert "resumed from" in said, said[-3000:]
    resumed_at = int(said.split("at step ")[1].split()[0])
    assert 1 <= resumed_at < 3
    # one trajectories.jsonl and one metrics.jsonl hold the whole run, each step once, with the
    # same data order as the run that was never killed; steps written after the checkpoint (and
    # trained again) were moved to archive/, not lost
    assert steps_of(run_dir / "out" / "trajectories.jsonl") == ref
    metrics = [json.loads(x) for x in (run_dir / "out" / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [1.0, 2.0, 3.0]
    for archived in (run_dir / "out" / "archive").glob("*/*.jsonl"):
        assert all(json.loads(x)["step"] > resumed_at for x in archived.read_text().splitlines())
    assert (run_dir / "ckpt" / "latest").read_text().strip() == "step_00000003"
    # the resumed run continues the same (offline) W&B run, under the same dir
    ids = {p.name.rsplit("-", 1)[1] for p in run_dir.glob("out/wandb/offline-run-*")}
    assert len(ids) == 1
    # each invocation's composed config is kept
    assert len(list((run_dir / "out" / ".hydra").glob("*/config.yaml"))) >= 1
