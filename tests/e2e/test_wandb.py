"""W&B end to end, offline (no network, no API key): one short training writes an offline run whose
files hold the step's metrics, the turn table and the HTML view; the checkpoint keeps the run id,
and a tracker started from that checkpoint's id continues the same run."""

import asyncio
import json

import pytest
from transformers import AutoTokenizer
from wandb_rows import offline_rows

from agentrl.ckpt import load_trainer_state
from agentrl.config import compose
from agentrl.tracking import Tracker, wandb_records
from agentrl.train import train
from agentrl.trajectory_view import TURN_COLUMNS, load_jsonl

pytestmark = pytest.mark.usefixtures("shared_ray")  # one Ray for the module's runs (conftest)

SMALL = ["trainer.tasks_per_step=2", "rollout.group_size=4", "rollout.max_new_tokens=48",
         "rollout.max_turns=2", "ray.num_cpus=2", "+env.args.format_reward=0.5",
         "trainer.steps=1", "checkpoint.every=1", "logging.wandb.enabled=true"]  # fmt: skip
NAMES = [
    "reward/mean", "reward/max", "rollout/turns", "rollout/tool_calls", "rollout/tool_call_rate",
    "rollout/sampled_tokens", "rollout/tool_latency_s", "stop/completed", "timing_s/rollout",
    "timing_s/update", "timing_s/step", "perf/sampled_tokens_per_s", "perf/train_tokens_per_s",
    "train/loss", "train/clipfrac", "train/approx_kl", "train/entropy", "train/grad_norm",
    "train/logprob_diff", "train/logprob_diff_max",
]  # fmt: skip


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    env = pytest.MonkeyPatch()
    for k in ("WANDB_API_KEY", "WANDB_MODE", "WANDB_DISABLED", "WANDB_DIR", "WANDB_RUN_ID"):
        env.delenv(k, raising=False)  # offline, whatever the machine has
    tmp = tmp_path_factory.mktemp("wandb")
    cfg = compose([*SMALL, f"checkpoint.dir={tmp}/ckpt"])
    history = asyncio.run(train(cfg, tmp / "out"))
    yield tmp, cfg, history
    env.undo()


def offline_run(out):
    (run,) = (out / "wandb").glob("offline-run-*")
    return run


def test_offline_run_holds_metrics_turn_table_and_html(trained):
    tmp, _, history = trained
    run = offline_run(tmp / "out")
    (row,) = offline_rows(run, 1, 20.0)
    assert row["_step"] == row["step"] == 1
    for name in NAMES:
        assert name in row and row[name] == pytest.approx(history[0][name]), name
    assert not [k for k in row if k.startswith("policy/")]  # all learner keys were renamed
    on_disk = json.loads((tmp / "out" / "metrics.jsonl").read_text())
    assert on_disk["train/grad_norm"] == row["train/grad_norm"]

    trajs = [json.loads(x) for x in (tmp / "out" / "trajectories.jsonl").read_text().splitlines()]
    table = json.loads((run / "files" / row["trajectories/turns"]["path"]).read_text())
    assert table["columns"] == TURN_COLUMNS
    assert len(table["data"]) == sum(max(len(t["turns"]), 1) for t in trajs) >= len(trajs)
    col = {c: i for i, c in enumerate(TURN_COLUMNS)}
    first, t0 = table["data"][0], trajs[0]
    assert (first[col["step"]], first[col["task"]], first[col["turn"]]) == (1, t0["task_id"], 0)
    assert first[col["assistant"]] == t0["turns"][0]["text"]
    assert first[col["stop_reason"]] == t0["stop_reason"]
    turn = t0["turns"][0]
    assert first[col["sampled_tokens"]] == turn["end"] - turn["start"]
    assert 0 <= first[col["logprob_diff"]] < 0.01  # the trainer's logprobs reached the table

    page = (run / "files" / row["trajectories/html"]["path"]).read_text()
    sampled = page.count('<span class="t" ')
    assert 0 < sampled <= sum(sum(t["loss_mask"]) for t in trajs)
    assert "trainer=" in page and "colour by |rollout" in page  # gaps, and the switch

    records = list(wandb_records(next(run.glob("run-*.wandb"))))
    (meta,) = [r.run for r in records if r.WhichOneof("record_type") == "run"]
    config = {u.key: json.loads(u.value_json) for u in meta.config.update}
    assert meta.project == "agentrl" and config["trainer"]["steps"] == 1


def test_checkpoint_keeps_the_run_id_and_a_resumed_tracker_continues_it(trained):
    tmp, cfg, _ = trained
    run_id = offline_run(tmp / "out").name.rsplit("-", 1)[1]
    state = load_trainer_state(tmp / "ckpt" / "step_00000001")
    assert state.wandb_run_id == run_id
    # what open_run does on resume, with this run's real trajectories as step 2
    items = load_jsonl(tmp / "out" / "trajectories.jsonl")
    trajs = [t for _, t, _ in items]
    lps = {i: lp for i, (_, _, lp) in enumerate(items) if lp is not None}
    assert lps, "trajectories.jsonl carries the trainer's logprobs"
    tok = AutoTokenizer.from_pretrained(cfg.model.tokenizer or cfg.model.resolve())
    tracker = Tracker(cfg.logging, tmp / "out2", run_id=state.wandb_run_id, tokenizer=tok)
    assert tracker.run_id == run_id
    tracker.log_step(2, {"step": 2.0, "reward/mean": 0.5}, trajs, lps)
    tracker.close()
    resumed = offline_run(tmp / "out2")
    assert resumed.name.endswith(f"-{run_id}")
    (row,) = offline_rows(resumed, 1, 20.0)
    assert row["_step"] == 2 and row["reward/mean"] == 0.5
    assert row["trajectories/turns"]["nrows"] == sum(max(len(t.turns), 1) for t in trajs)
