"""Evaluation episodes are saved (issue 38): every evaluation's episodes, token-exact, in
<out>/eval_trajectories.jsonl at the step of its eval/* metrics; a resumed run keeps the earlier
evaluations and appends; `agentrl view RUN --eval` draws them. A scripted rollout stands in for
the engines (tests/e2e/test_train.py -k evaluation runs the real trainer)."""

import asyncio
import json
import math

from test_tracking import two_turns  # tests/unit is on sys.path (no packages)

from agentrl.cli.view import main
from agentrl.evaluate import evaluate
from agentrl.tracking import JsonlSink, LoggingConfig, Tracker, WandbConfig
from agentrl.trajectory_view import load_jsonl
from agentrl.types import Task, Trajectory


class ScriptedRollout:
    """run_group as the evaluation calls it: `samples` episodes of a task, rewards scripted by
    (evaluation, task, sample) so every evaluation scores differently."""

    def __init__(self, tok) -> None:
        self.tok, self.calls = tok, 0

    async def run_group(self, task: Task, samples: int) -> list[Trajectory]:
        self.calls += 1
        return [
            two_turns(self.tok, task.id, i, reward=((self.calls + i) % 3) / 2)
            for i in range(samples)
        ]


def test_each_evaluation_saves_its_episodes_and_the_view_draws_them(
    tmp_path, qwen_tokenizer, qwen_tokenizer_dir
):
    tasks = [Task(id=f"eval-{k}") for k in range(3)]
    rollout = ScriptedRollout(qwen_tokenizer)
    cfg = LoggingConfig(wandb=WandbConfig(enabled=False))

    def run(steps: list[int]) -> dict[int, tuple[dict, list[Trajectory]]]:
        tracker, seen = Tracker(cfg, tmp_path), {}
        for step in steps:  # as Trainer._evaluate: the episodes, then the step's metrics
            metrics, trajs = asyncio.run(evaluate(rollout, tasks, samples=2))
            tracker.log_eval(step, trajs)
            tracker.log_step(step, {**metrics, "step": float(step)})
            seen[step] = metrics, trajs
        tracker.close()
        return seen

    seen = run([0, 2, 3])
    JsonlSink.continue_run(tmp_path, 2)  # resumed from the checkpoint of step 2: 3 is redone
    seen.update(run([3, 4]))
    rows = [json.loads(x) for x in (tmp_path / "eval_trajectories.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0] * 6 + [2] * 6 + [3] * 6 + [4] * 6  # 3 tasks x 2
    assert all(r["eval"] is True and "trainer_logprobs" not in r for r in rows)
    metrics = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [int(m["step"]) for m in metrics] == [0, 2, 3, 4]
    for m in metrics:
        step = int(m["step"])
        saved = [r for r in rows if r["step"] == step]
        assert math.isclose(sum(r["reward"] for r in saved) / 6, m["eval/reward_mean"])
        assert len(saved) == m["eval/episodes"]
        assert [(r["task_id"], r["sample_index"]) for r in saved] == [
            (t.id, i) for t in tasks for i in range(2)
        ]
        # token-exact: the very trajectories the evaluation returned
        assert [t for _, t, _ in load_jsonl(tmp_path / "eval_trajectories.jsonl", step)] == (
            seen[step][1]
        )
    assert not (tmp_path / "trajectories.jsonl").exists()  # evaluations are never training's

    main(
        [str(tmp_path), "--eval", "--step", "2", "-n", "6", "--tokenizer", str(qwen_tokenizer_dir)]
    )
    page = (tmp_path / "view_eval_2.html").read_text()
    assert "eval after step 2 · eval-0 #0" in page and 'class="t"' in page
    main([str(tmp_path), "--eval", "--tokenizer", str(qwen_tokenizer_dir)])  # the last one
    assert "eval after step 4 · eval-" in (tmp_path / "view_eval_4.html").read_text()
