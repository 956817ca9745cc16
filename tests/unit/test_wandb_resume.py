"""A resumed run's W&B rows, with real wandb offline (no network, no API key): the steps it trains
again (those its killed run logged after the checkpoint) land as rows of their own, where W&B,
which drops a row whose step is below one it holds, used to drop them. Starts wandb's service."""

import pytest
from wandb_rows import offline_rows

from agentrl.tracking import LoggingConfig, Tracker, WandbConfig, wandb_records

OFFLINE = LoggingConfig(wandb=WandbConfig(enabled=True, mode="offline", system_metrics=False))


@pytest.fixture(autouse=True)
def _offline(monkeypatch):
    for k in ("WANDB_API_KEY", "WANDB_MODE", "WANDB_DISABLED", "WANDB_DIR", "WANDB_RUN_ID"):
        monkeypatch.delenv(k, raising=False)  # offline, whatever the machine has


def test_steps_a_resumed_run_trains_again_land_in_its_wandb_run(tmp_path):
    killed = Tracker(OFFLINE, tmp_path, run_name="exp1")
    for step in range(6):  # the untrained policy's evaluation at 0, steps 1-5; saved at step 3
        killed.log_step(step, {"step": float(step), "reward/mean": step / 10})
    killed.close()
    first = killed.wandb.run_dir
    assert [r["_step"] for r in offline_rows(first, 6)] == [0, 1, 2, 3, 4, 5]  # unresumed: its step

    resumed = Tracker(OFFLINE, tmp_path, run_name="exp1", run_id=killed.run_id)
    assert resumed.run_id == killed.run_id
    for step in (4, 5, 6):  # from the checkpoint at step 3: 4 and 5 are trained again
        resumed.log_step(step, {"step": float(step), "reward/mean": 0.5 + step / 10})
    resumed.close()
    again = resumed.wandb.run_dir
    # the part's own directory (W&B adds "-1" to a name taken in the same second)
    assert again != first and (again / f"run-{killed.run_id}.wandb").is_file()
    rows = offline_rows(again, 3)
    assert [r["_step"] for r in rows] == [6, 7, 8]  # past the killed run's last row: kept
    assert [(r["step"], r["reward/mean"]) for r in rows] == [(4, 0.9), (5, 1.0), (6, 1.1)]
    metrics = [
        r.metric
        for r in wandb_records(next(again.glob("run-*.wandb")))
        if r.WhichOneof("record_type") == "metric"
    ]
    assert any(m.glob_name == "*" and m.step_metric == "step" for m in metrics)  # the x axis
    # a third part, killed again after step 6 and resumed from 5: its rows follow the second
    # part's, whose directory W&B named "<dir>-1" when it started in the first part's second
    if not again.name.endswith("-1"):  # the second it started in was another: name it so
        again.rename(again.with_name(again.name + "-1"))
    third = Tracker(OFFLINE, tmp_path, run_name="exp1", run_id=killed.run_id)
    third.log_step(6, {"step": 6.0, "reward/mean": 1.2})
    third.close()
    assert [r["_step"] for r in offline_rows(third.wandb.run_dir, 1)] == [9]


def test_an_evaluation_shares_the_row_of_its_steps_metrics(tmp_path):
    tracker = Tracker(OFFLINE, tmp_path, run_name="exp1")
    tracker.log_eval(0, [])  # no episodes: nothing to log but the row it would share
    tracker.log_step(0, {"step": 0.0, "eval/reward_mean": 0.25})
    tracker.log_step(1, {"step": 1.0, "reward/mean": 0.5})
    tracker.close()
    rows = offline_rows(tracker.wandb.run_dir, 2)
    assert [(r["_step"], r["step"]) for r in rows] == [(0, 0), (1, 1)]
    assert rows[0]["eval/reward_mean"] == 0.25
