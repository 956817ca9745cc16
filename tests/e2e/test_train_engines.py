"""Training runs against the engine: LoRA adapters reach it and a resumed run serves the
checkpoint; a dead engine is restarted with the current weights, then the run gives up (split
from test_train.py so that xdist spreads the runs)."""

import asyncio
import json
import os
import signal
from pathlib import Path

import pytest
import torch
from train_kit import overrides, token_logprobs
from transformers import AutoModelForCausalLM

from agentrl.config import compose
from agentrl.run import open_run
from agentrl.train import Trainer, TrainingError, train

pytestmark = pytest.mark.usefixtures("shared_ray")  # one Ray for the module's runs (conftest)


@pytest.mark.parametrize("sync", ["auto", "merged"])
def test_lora_reaches_the_engine_and_a_resumed_run_serves_the_checkpoints(sync, tmp_path):
    """learner.lora.sync=auto on the dev server: each push loads only the adapters (SGLang's LoRA
    routes) and every turn samples from them; a resumed run's engine serves the base model plus
    the checkpoint's adapter. merged: the whole merged model goes, and a resumed engine starts
    from it. Either way the resumed engine serves exactly the checkpoint's merged model.

    And what LoRA trains: each update raises the logprobs of the samples its advantages favour
    relative to those they disfavour; the checkpoint's adapter/ is PEFT's own format, which PEFT
    merges onto the base into the checkpoint's model/ (what the engine serves); every weight no
    adapter touches is the base's, bit for bit. (LoRA is no algorithm family of its own: its
    learning run, tests/e2e/test_learning.py, is not in CI; AGENTRL_LEARN_ALL=1 runs it.)"""
    from peft import PeftModel

    from agentrl.advantage import Truncation, compute_advantages
    from agentrl.engine import SamplingParams
    from agentrl.types import Trajectory

    lora = [
        "learner.lora.rank=4",
        "learner.lr=5e-3",
        # no momentum: each update follows its own step's advantages, which is what the check
        # below asserts (with Adam's beta1 0.9 step 2 is half step 1's direction, and failed so)
        "learner.betas=[0.0,0.999]",
        # a step whose groups all scored alike trains nothing; one CI run drew two such steps
        # (8 samples each) and its weights never moved: such groups are redrawn
        "trainer.sampling.dynamic_sampling=true",
        "trainer.deterministic=true",  # and seeded: the same draws on every machine
        "checkpoint.every=1",
        f"learner.lora.sync={sync}",
    ]
    cfg = compose(overrides(tmp_path, "trainer.steps=2", *lora))
    history = asyncio.run(train(cfg, tmp_path / "out"))
    model_mb = sum(p.numel() * 4 for p in AutoModelForCausalLM.from_pretrained(
        cfg.model.resolve()).parameters()) / 2**20  # fmt: skip
    for h in history:  # adapters only, or the whole model
        assert (h["sync/mb"] < 0.2 * model_mb) == (sync == "auto"), (h["sync/mb"], model_mb)
        assert h["train/logprob_diff"] <= 0.01 and h["rollout/off_version_turns"] == 0
    prompt, greedy = [1, 5, 17, 100, 300], SamplingParams(max_new_tokens=8, temperature=0)

    async def serve_resumed():
        async with open_run(cfg, tmp_path / "out") as run:
            info = (await run.engine.control.server_info())[0]
            return run.engine.gen.lora, info, await run.engine.generate(prompt, greedy)

    name, info, comp = asyncio.run(serve_resumed())
    assert info["weight_version"] == "2"
    if sync == "auto":
        assert name == "agentrl-v2-resumed" and list(info["loaded_adapters"]) == [name]
    else:
        assert name is None and not info["loaded_adapters"]

    def logprobs(model_dir) -> list[float]:
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
        with torch.no_grad():
            logits = model(torch.tensor([prompt + comp.token_ids])).logits[0]
        lp = torch.log_softmax(logits[len(prompt) - 1 : -1], -1)
        return lp[torch.arange(len(comp.token_ids)), torch.tensor(comp.token_ids)].tolist()

    trained = logprobs(tmp_path / "ckpt" / "step_00000002" / "policy" / "model")
    base = logprobs(cfg.model.resolve())
    assert max(abs(a - b) for a, b in zip(comp.logprobs, trained, strict=True)) < 1e-4
    assert max(abs(a - b) for a, b in zip(comp.logprobs, base, strict=True)) > 1e-3

    # each update moved the logprobs of the samples its advantages favour up relative to those
    # they disfavour (per token, on average; no momentum carries one step's direction into the
    # next, see above; at lr 5e-2 a step also shifts every logprob, so
    # the sum of advantage x change is no test). A step whose groups all scored alike has no
    # advantages and moves nothing; the weights moved (above), so one of them had some
    rows = [
        json.loads(x) for x in (tmp_path / "out" / "trajectories.jsonl").read_text().splitlines()
    ]
    truncation = Truncation(cfg.rollout.truncated, cfg.rollout.truncated_reward)
    weights = [cfg.model.resolve(), *(tmp_path / "ckpt" / f"step_0000000{s}" / "policy" / "model"
                                      for s in (1, 2))]  # fmt: skip
    with_signal = []
    for step in (1, 2):
        groups: dict[str, list[Trajectory]] = {}
        for row in rows:
            if row["step"] == step:
                groups.setdefault(row["task_id"], []).append(Trajectory.from_dict(row))
        trajs = [t for g in groups.values() for t in g]
        adv = compute_advantages(list(groups.values()), cfg.algo.advantage,
                                 truncation=truncation).advantages  # fmt: skip
        if not any(a.abs().max() > 0 for a in adv):
            continue
        with_signal.append(step)
        before, after = (AutoModelForCausalLM.from_pretrained(weights[i], dtype=torch.float32)
                         for i in (step - 1, step))  # fmt: skip
        moved: dict[bool, list[torch.Tensor]] = {True: [], False: []}  # favoured or not
        for a, t in zip(adv, trajs, strict=True):
            if (a != 0).any():
                delta = token_logprobs(after, t.token_ids) - token_logprobs(before, t.token_ids)
                moved[bool(a.sum() > 0)].append(delta[a != 0])
        up, down = (torch.cat(moved[k]).mean().item() for k in (True, False))
        assert up > down, f"update {step} favoured the samples its advantages rank low: {up, down}"
    assert with_signal, "no step had a learning signal"
    # PEFT's adapter merged onto the base is the model the engine serves; only the projections
    # LoRA adapts moved
    final = tmp_path / "ckpt" / "step_00000002" / "policy"
    served = dict(AutoModelForCausalLM.from_pretrained(final / "model").named_parameters())
    peft = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(cfg.model.resolve()),
                                     final / "adapter").merge_and_unload()  # fmt: skip
    merged = dict(peft.named_parameters())
    assert max((merged[n] - p).abs().max().item() for n, p in served.items()) < 1e-5
    base_w = dict(AutoModelForCausalLM.from_pretrained(cfg.model.resolve()).named_parameters())
    moved = {n for n, p in served.items() if not torch.equal(p, base_w[n])}
    assert moved and all(n.endswith("proj.weight") for n in moved), sorted(moved)[:5]


def kill_devserver(url: str) -> None:
    port = url.rsplit(":", 1)[1]
    for pid in os.listdir("/proc"):
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except (OSError, ValueError):
            continue
        if b"agentrl.engine.dev" in cmd and port.encode() in cmd:
            os.kill(int(pid), signal.SIGKILL)


@pytest.mark.parametrize("colocate", ["false", "true"])
def test_a_dead_engine_is_restarted_with_the_current_weights_then_gives_up(colocate, tmp_path):
    """Killed after the rollout, before the push: restarted before the push (colocated: with the
    learner off the GPU meanwhile, its memory released like the others'), so the step's own push
    reaches it and the next step samples the new weights from it. Killed between steps: every
    episode of the next step fails; restarted on its port, it gets the current weights
    (colocated: through a step's hand-over: release, onload, push, offload; the dev server
    accepts the memory calls) and the whole step is re-issued. Past engine.max_restarts the run
    stops, naming the server's log."""
    cfg = compose(overrides(tmp_path, "trainer.steps=4", "engine.max_retries=1",
                            "engine.backoff_s=0.1", "engine.max_restarts=2",
                            f"engine.colocate={colocate}"))  # fmt: skip

    async def go():
        async with open_run(cfg, tmp_path / "out") as run:
            tr = Trainer(cfg, run)
            update = tr._update

            def killed_then_update(*args):
                kill_devserver(run.engine.urls[0])
                return update(*args)

            tr._update = killed_then_update
            m = await tr.step()
            tr._update = update
            assert m["engine/restarts"] == 1 and m["rollout/reissued"] == 0, "killed in update"
            assert await run.engine.control.get_weight_version() == ["1"]
            m = await tr.step()  # sampled by the restarted server, with step 1's weights
            assert m["engine/restarts"] == 0 and m["rollout/off_version_turns"] == 0
            assert m["stop/aborted"] == 0 and m["rollout/trajectories"] == 8
            assert m["train/logprob_diff"] < 1e-4, "restarted in step 1: old weights"
            kill_devserver(run.engine.urls[0])  # the only server: every episode of step 3 fails
            m = await tr.step()
            # restarted on its port, given the weights of step 2, and the whole step re-issued
            assert m["engine/restarts"] == 1 and m["rollout/reissued"] == 8, "killed between steps"
            assert m["stop/aborted"] == 0 and m["rollout/trajectories"] == 8
            assert m["train/logprob_diff"] < 1e-4, "restarted in step 3: old weights"
            assert await run.engine.control.get_weight_version() == ["3"]
            kill_devserver(run.engine.urls[0])  # engine.max_restarts=2: the third death stops
            with pytest.raises(TrainingError, match=r"failed again after 2 restarts[\s\S]*log"):
                await tr.step()

    asyncio.run(go())
