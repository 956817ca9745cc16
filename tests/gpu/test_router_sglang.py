"""Two colocated SGLang servers, one per GPU, behind the router (smg when installed), the learner's
two FSDP2 ranks on the same GPUs (issue 19, run 4): the shipped tiny model trains on code_exec;
server 0 is SIGKILLed in the middle of a step's rollout. It comes back on its port with the
current weights (a colocated hand-over: release, onload, push, offload), the groups that lost an
episode are rolled out again whole, and no step is short of a sample or trains a stale one."""

from __future__ import annotations

import asyncio
import importlib.util
import os
import signal

import pytest
from gpu_helpers import MACHINE_GPUS

from agentrl.config import compose
from agentrl.run import open_run
from agentrl.train import Trainer

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(MACHINE_GPUS < 2, reason="needs two CUDA GPUs"),
]
STEPS, TASKS, GROUP = 4, 8, 8


def test_a_colocated_server_killed_mid_rollout_comes_back_with_nothing_lost(tmp_path):
    pytest.importorskip("sglang")
    cfg = compose([
        "engine=sglang", "learner=gpu", "weight_sync.method=tensor", "engine.num_servers=2",
        "learner.num_workers=2", f"trainer.steps={STEPS}", f"trainer.tasks_per_step={TASKS}",
        f"rollout.group_size={GROUP}", f"checkpoint.dir={tmp_path}/ckpt", "checkpoint.every=100",
        "logging=local",
    ])  # fmt: skip

    async def go() -> list[dict[str, float]]:
        async with open_run(cfg, tmp_path / "out") as run:
            tr = Trainer(cfg, run)
            router = "smg" if importlib.util.find_spec("smg") else "client"
            print(f"servers {run.fleet.urls} via {router}")
            history = [await tr.step()]
            victim, generate, calls = run.fleet.procs[0], run.engine.generate, []

            async def kill_mid_rollout(*args, **kw):  # step 2's 32nd request: half are sent
                calls.append(1)
                if len(calls) == TASKS * GROUP // 2:
                    os.killpg(victim.pid, signal.SIGKILL)
                return await generate(*args, **kw)

            run.engine.generate = kill_mid_rollout
            history.append(await tr.step())
            run.engine.generate = generate
            assert victim.poll() is not None and run.fleet.procs[0] is not victim, "not restarted"
            while len(history) < STEPS:
                history.append(await tr.step())
            versions = await run.engine.control.get_weight_version()
            assert versions == [str(STEPS)] * 2, versions
            return history

    history = asyncio.run(go())
    for h in history:
        print({k: round(v, 4) for k, v in h.items() if k.split("/")[0] in {"engine", "rollout",
               "train", "timing_s", "sync"} and "hist" not in k})  # fmt: skip
    assert sum(h["engine/restarts"] for h in history) == 1
    for h in history:  # nothing lost, nothing stale
        assert h["rollout/trajectories"] == TASKS * GROUP and h["stop/aborted"] == 0
        assert h["rollout/off_version_turns"] == 0
        assert h["train/logprob_diff"] <= 0.02, "a server samples other weights than trained"
