"""The shipped trainer on a real model family, on ONE GPU: a random-weight Qwen3-0.6B-shaped
model with the real Qwen BPE and Qwen3's own chat template (trl/chat_templates/qwen3.jinja, read
from the installed package, never copied into the repo), colocated SGLang, FSDP2 learner, CUDA-IPC
weight sync, `env=code_exec`, 3 steps.

A random model never writes <tool_call> by itself, so the model first gets a short supervised
warm-up on the GPU (rendered code_exec dialogues: call `python` via hermes <tool_call> JSON, read
the output, answer; a quarter answer at once), and the test measures how often it then calls a
tool (HF sampling before the run, `rollout/tool_call_rate` in it).

Asserts, every step: no episode `aborted` (Qwen3's template renders the last assistant turn
differently, so a tool round trip must still produce a token-exact observation delta),
SGLang's sampled logprobs match the trainer's (`train/logprob_diff` <= 0.01), tools were called.
Prints every step's metrics (zero-gradient-share metrics included, when the trainer reports them)
so the figures can be quoted. `AGENTRL_TEST_ARTIFACTS=DIR` also copies metrics.jsonl,
trajectories.jsonl and the server log there.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import time
from collections import Counter
from pathlib import Path

import pytest
import torch
from gpu_helpers import build_qwen3_toolcaller, sglang_test_args, trl_chat_template

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]
STEPS, TASKS, SAMPLES = 3, 4, 4
KEY = (  # the figures quoted per step, in this order (then every zero_grad metric)
    "stop/aborted", "stop/completed", "rollout/tool_call_rate", "rollout/tool_calls",
    "rollout/parse_errors", "rollout/tool_errors", "rollout/turns", "reward/mean", "reward/std",
    "train/logprob_diff", "train/logprob_diff_max", "train/grad_norm", "train/clipfrac",
    "timing_s/rollout", "timing_s/step",
)  # fmt: skip


def _rows(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def _fmt(v) -> str:
    return f"{v:.4g}" if isinstance(v, float) else str(v)


def _report(out: Path, history: list[dict]) -> None:
    """Print every step's metrics, then why episodes ended and one tool-calling turn."""
    steps = history or _rows(out / "metrics.jsonl")
    for h in steps:  # everything first; the quoted figures last, where the output ends
        all_ = json.dumps({k: h[k] for k in sorted(h)}, default=str)
        print(f"\nREALQWEN3 step {int(h.get('step', 0))} all: {all_}")
    for h in steps:
        s = int(h.get("step", 0))
        zero = {k: v for k, v in h.items() if "zero_grad" in k}
        print(f"\nREALQWEN3 step {s}: " + "  ".join(f"{k}={_fmt(h[k])}" for k in KEY if k in h))
        print(f"REALQWEN3 step {s} zero_grad metrics: " + (
            "  ".join(f"{k}={_fmt(v)}" for k, v in sorted(zero.items())) or "(none reported)"))  # fmt: skip
    trajs = _rows(out / "trajectories.jsonl")
    if not trajs:
        return
    stops = Counter(str(t.get("stop_reason")) for t in trajs)
    print(f"\nREALQWEN3 stop reasons over {len(trajs)} trajectories: {dict(stops)}")
    errors = Counter((t.get("error") or "").splitlines()[0][:300] for t in trajs if t.get("error"))
    for err, n in errors.most_common(3):
        print(f"REALQWEN3 error x{n}: {err}")
    for t in trajs:
        turns = t.get("turns") or []
        if turns and turns[0].get("num_tool_calls"):
            print(f"REALQWEN3 a sampled tool call (stop {t.get('stop_reason')}): "
                  f"{turns[0].get('text', '')[:300]!r}")  # fmt: skip
            break


def test_real_qwen3_template_code_exec_on_colocated_sglang(tmp_path):
    pytest.importorskip("sglang")
    from agentrl.config import compose
    from agentrl.train import train

    template = trl_chat_template("qwen3")
    model_dir = tmp_path / "qwen3-0.6b-toolcaller"
    print(
        f"\nREALQWEN3 warm-up of a random Qwen3-0.6B-shaped model on {torch.cuda.get_device_name()}"
    )
    warm = build_qwen3_toolcaller(model_dir, template)
    print(
        f"REALQWEN3 warm-up: {warm['params'] / 1e6:.0f}M params, {warm['steps']} AdamW steps, "
        f"loss {warm['loss_first']:.3f} -> {warm['loss_last']:.3f}, {warm['seconds']:.0f} s; "
        "sampled first turns (T=1): "
        + ", ".join(
            f"step {c['step']}: tried {c['tried']:.2f} valid {c['valid']:.2f}"
            for c in warm["checks"]
        )  # fmt: skip
    )
    print(f"REALQWEN3 warm-up example: {warm['example'][:300]!r}")

    overrides = [
        "env=code_exec", "engine=sglang", sglang_test_args(), "learner=gpu", "weight_sync.method=tensor",
        "model=local", f"model.path={model_dir}", "logging=local",
        f"trainer.steps={STEPS}", f"trainer.tasks_per_step={TASKS}", f"rollout.group_size={SAMPLES}",
        f"checkpoint.every={STEPS}", f"checkpoint.dir={tmp_path}/ckpt", "checkpoint.resume=never",
        # reward variance even when no answer is right, so advantages (and gradients) are not all 0
        "+env.args.format_reward=0.1",
    ]  # fmt: skip
    # never stop early on aborted episodes: this test counts them itself and prints them
    cfg = compose([*overrides, "trainer.guards.max_aborted_frac=1.0"])
    out = tmp_path / "out"
    history: list[dict] = []
    t0 = time.monotonic()
    try:
        history = asyncio.run(train(cfg, out))
    finally:
        print(f"\nREALQWEN3 trainer: {time.monotonic() - t0:.0f} s (server start included)")
        _report(out, history)
        art = os.environ.get("AGENTRL_TEST_ARTIFACTS")
        if art:
            Path(art).mkdir(parents=True, exist_ok=True)
            for f in [out / "metrics.jsonl", out / "trajectories.jsonl", *out.glob("*server*.log")]:
                if f.exists():
                    shutil.copy(f, Path(art) / f"realqwen3-{f.name}")

    assert [int(h["step"]) for h in history] == list(range(1, STEPS + 1))
    for h in history:
        s = int(h["step"])
        assert h["stop/aborted"] == 0, f"step {s}: {h['stop/aborted']:g} episodes aborted"
        assert "train/logprob_diff" in h, f"step {s} trained nothing"
        assert h["train/logprob_diff"] <= 0.01, f"step {s}: {h['train/logprob_diff']:.4f}"
        assert h["rollout/tool_call_rate"] > 0, f"step {s}: no tool call sampled"
