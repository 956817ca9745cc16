"""Metric names and reductions, the turn table, the HTML view, the JSONL sink, and the tracker's
behaviour when W&B fails (no wandb process is started here; tests/e2e/test_wandb.py does that)."""

import json
import math
import re

import pytest
from rich.console import Console

from agentrl import tracking
from agentrl.cli.view import main
from agentrl.display import ProgressLine, progress_text
from agentrl.metrics import metric_name, rollout_metrics, step_metrics
from agentrl.tracking import LoggingConfig, Tracker, WandbConfig, resolve_mode
from agentrl.trajectory_view import (
    TURN_COLUMNS,
    gap_colour,
    load_jsonl,
    pick,
    render_html,
    trajectory_from_dict,
    turn_rows,
)
from agentrl.types import FinishReason, Message, StopReason, ToolCall, Trajectory, Turn

PROMPT = "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n"
CALL = (
    '<tool_call>\n{"name": "python", "arguments": {"code": "print(2+2)"}}\n</tool_call><|im_end|>'
)
OBS = "\n<|im_start|>user\n<tool_response>\n4\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
ANSWER = "<answer>4 & <b></answer><|im_end|>"


def two_turns(tok, task="t1", sample=0, reward=1.0, stop=StopReason.COMPLETED) -> Trajectory:
    """prompt | call (sampled) | tool result | answer (sampled)."""
    p, a1, o, a2 = (tok.encode(x) for x in (PROMPT, CALL, OBS, ANSWER))
    ids = p + a1 + o + a2
    mask = [0] * len(p) + [1] * len(a1) + [0] * len(o) + [1] * len(a2)
    s1, e1 = len(p), len(p) + len(a1)
    s2 = e1 + len(o)
    call = ToolCall(id="c0", name="python", arguments={"code": "print(2+2)"})
    turns = [
        Turn(s1, e1, s2, "0", FinishReason.STOP, Message(role="assistant", tool_calls=[call]),
             text=CALL, observations=[Message(role="tool", content="4", name="python")],
             num_tool_calls=1, tool_latency_s=0.25, gen_latency_s=0.5),
        Turn(s2, len(ids), len(ids), "0", FinishReason.STOP,
             Message(role="assistant", content="<answer>4</answer>"), text=ANSWER,
             gen_latency_s=0.25, reward=0.5, segments=[(1, "0"), (len(a2) - 1, "1")]),
    ]  # a push cut the answer after its first token  # fmt: skip
    msgs = [Message(role="user", content="What is 2+2?")]
    return Trajectory(task, sample, ids, mask, [-0.5 * m for m in mask], len(p), turns, msgs,
                      stop, reward=reward, reward_components={"correct": reward, "total": reward})  # fmt: skip


def no_turn(tok) -> Trajectory:
    ids = tok.encode(PROMPT)
    return Trajectory("t2", 0, ids, [0] * len(ids), [0.0] * len(ids), len(ids), [],
                      [Message(role="user", content="hi")], StopReason.ABORTED, error="env blew up")  # fmt: skip


def trainer_lps(traj: Trajectory, gap: float) -> list[float]:
    return [lp - gap if m else 0.0 for lp, m in zip(traj.logprobs, traj.loss_mask, strict=True)]


# -- metrics ------------------------------------------------------------------------------------
def test_rollout_metrics_by_hand(qwen_tokenizer):
    a, b = two_turns(qwen_tokenizer, reward=1.0), two_turns(qwen_tokenizer, sample=1, reward=0.0)
    m = rollout_metrics([a, b, no_turn(qwen_tokenizer)])
    assert m["reward/mean"] == 0.5 and m["reward/std"] == 0.5  # the aborted one is not scored
    assert m["reward/correct"] == 0.5 and "reward/total" not in m
    assert m["stop/completed"] == 2 and m["stop/aborted"] == 1 and m["stop/length"] == 0
    assert m["rollout/turns"] == 4 / 3 and m["rollout/turns_max"] == 2
    assert m["rollout/tool_call_rate"] == 0.5  # 2 of 4 turns called a tool
    assert m["rollout/tool_latency_s"] == 0.25  # over the turns that called a tool only
    assert m["rollout/sampled_tokens"] == 2 * a.num_sampled
    assert m["rollout/traj_tokens_max"] == len(a.token_ids)
    nan = rollout_metrics([two_turns(qwen_tokenizer, reward=math.nan)])  # a reward bug: no crash
    assert math.isnan(nan["reward/mean"]) and math.isnan(nan["reward/std"])


def test_prefix_cache_hit_is_cached_over_read_prompt_tokens(qwen_tokenizer):
    a, b = two_turns(qwen_tokenizer), two_turns(qwen_tokenizer, sample=1)
    for t, (first, later) in ((a, (0, 90)), (b, (20, 100))):  # (cached tokens per turn)
        t.turns[0].prompt_tokens, t.turns[0].cached_tokens = 40, first
        t.turns[1].prompt_tokens, t.turns[1].cached_tokens = 100, later
    m = rollout_metrics([a, b])
    assert m["rollout/prefix_cache_hit_first"] == 20 / 80
    assert m["rollout/prefix_cache_hit_later"] == 190 / 200
    assert m["rollout/prefix_cache_hit"] == 210 / 280


def test_learner_names_map_to_train_names():
    assert metric_name("policy/pg_clipfrac_high") == "train/clipfrac_high"
    assert metric_name("policy/kl_ref") == "train/kl_ref_loss"
    assert metric_name("policy/grad_norm") == "train/grad_norm"
    assert metric_name("policy/some_new_key") == "train/some_new_key"
    assert metric_name("critic/loss") == "critic/loss" and metric_name("step") == "step"


def test_step_metrics_derive_clipfrac_timing_perf_and_entropy(qwen_tokenizer):
    t = two_turns(qwen_tokenizer)
    raw = {
        "rollout/sampled_tokens": 100.0, "policy/pg_clipfrac_low": 0.1,
        "policy/pg_clipfrac_high": 0.2, "policy/grad_norm": 3.0, "train/logprob_diff": 0.01,
        "timing_s/rollout": 2.0, "timing_s/update": 1.0, "timing_s/sync": 1.0, "step": 1.0,
    }  # fmt: skip
    gaps = trainer_lps(t, 0.25)
    gaps[t.turns[0].start] -= 0.5  # one token 0.75 away from the rollout, the rest 0.25
    m = step_metrics(raw, [t], {0: gaps})
    assert "policy/grad_norm" not in m and m["train/grad_norm"] == 3.0
    assert m["train/clipfrac"] == pytest.approx(0.3)
    assert m["timing_s/step"] == 4.0 and m["perf/step_tokens_per_s"] == 25.0
    assert m["perf/train_tokens_per_s"] == len(t.token_ids) / 1.0
    assert m["train/logprob_diff_max"] == pytest.approx(0.75)
    # entropy estimate: mean -log pi_trainer over sampled tokens = 0.75 + 0.5 / n
    n = t.num_sampled
    assert m["train/entropy"] == pytest.approx(0.75 + 0.5 / n)
    exact = step_metrics({**raw, "policy/entropy": 1.5}, [t], {0: gaps})
    assert exact["train/entropy"] == 1.5  # the loss's exact entropy wins
    assert raw["policy/grad_norm"] == 3.0  # input untouched


# -- turn table and HTML ------------------------------------------------------------------------
def test_turn_rows_one_row_per_turn(qwen_tokenizer):
    t, bad = two_turns(qwen_tokenizer), no_turn(qwen_tokenizer)
    rows = turn_rows(7, [t, bad], {0: trainer_lps(t, 0.01)})
    assert len(rows) == 3 and all(len(r) == len(TURN_COLUMNS) for r in rows)
    r0, r1, r2 = (dict(zip(TURN_COLUMNS, r, strict=True)) for r in rows)
    assert (r0["step"], r0["task"], r0["turn"], r1["turn"]) == (7, "t1", 0, 1)
    assert r0["prompt"] == "What is 2+2?" and r1["prompt"] == ""
    assert json.loads(r0["tool_calls"]) == [{"name": "python", "arguments": {"code": "print(2+2)"}}]
    assert r0["tool_results"] == "[python] 4" and r1["tool_results"] == ""
    assert r0["sampled_tokens"] == t.turns[0].end - t.turns[0].start
    assert r0["obs_tokens"] == t.turns[0].obs_end - t.turns[0].end
    assert r0["logprob_diff"] == pytest.approx(0.01) and r1["turn_reward"] == 0.5
    assert (r2["task"], r2["stop_reason"], r2["error"]) == ("t2", "aborted", "env blew up")
    assert r2["logprob_diff"] is None


def test_pick_prefers_best_worst_tools_and_gap(qwen_tokenizer):
    ts = [two_turns(qwen_tokenizer, sample=i, reward=r) for i, r in enumerate([0.5, 1.0, 0.0, 0.5])]
    lps = {i: trainer_lps(t, 0.3 if i == 3 else 0.0) for i, t in enumerate(ts)}
    assert pick(ts, lps, 3) == [1, 2, 0]
    assert pick(ts, lps, 4) == [1, 2, 0, 3] and pick(ts, None, 0) == []


def test_gap_colour_scale():
    assert gap_colour(1e-5) == gap_colour(1e-3) == "#c8ecd0"  # green up to 1e-3
    assert gap_colour(1e-2) == "#ffee99" and gap_colour(5.0) == "#f29b9b"
    assert gap_colour(None) == "#dddddd" and gap_colour(math.nan) == "#dddddd"


def test_html_has_every_sampled_token_escaped_and_coloured(qwen_tokenizer):
    t = two_turns(qwen_tokenizer)
    lps = trainer_lps(t, 0.0)
    lps[t.turns[1].start] -= 0.1  # one visibly off token
    page = render_html([(3, t, lps), (3, no_turn(qwen_tokenizer), None)], qwen_tokenizer)
    spans = re.findall(r'<span class="t" style="--d:(#[0-9a-f]{6})"', page)
    assert len(spans) == t.num_sampled
    assert spans.count("#f29b9b") == 1 and spans.count("#c8ecd0") == t.num_sampled - 1
    assert "<b>" not in page and "&amp;" in page and "&lt;|im_start|&gt;user" in page  # escaped
    assert "assistant · turn 1" in page and "observation" in page and "env blew up" in page
    assert "<script" not in page


def test_html_elides_long_prompts(qwen_tokenizer):
    t = two_turns(qwen_tokenizer)
    page = render_html([(1, t, None)], qwen_tokenizer, max_tokens=256)
    assert "tokens not shown" not in page
    long = Trajectory(**{**t.__dict__, "token_ids": [198] * 500 + t.token_ids,
                         "loss_mask": [0] * 500 + t.loss_mask, "logprobs": [0.0] * 500 + t.logprobs,
                         "prompt_len": t.prompt_len + 500,
                         "turns": [Turn(**{**u.__dict__, "start": u.start + 500, "end": u.end + 500,
                                           "obs_end": u.obs_end + 500}) for u in t.turns]})  # fmt: skip
    page = render_html([(1, long, None)], qwen_tokenizer, max_tokens=256)
    assert re.search(r"… \d+ tokens not shown …", page)
    assert page.count('class="t"') == t.num_sampled  # sampled tokens are never elided here


# -- sinks and the tracker ----------------------------------------------------------------------
def test_jsonl_round_trip_and_cli(tmp_path, qwen_tokenizer, qwen_tokenizer_dir):
    t = two_turns(qwen_tokenizer)
    tracker = Tracker(LoggingConfig(wandb=WandbConfig(enabled=False)), tmp_path)
    tracker.log_step(1, {"step": 1.0, "reward/mean": 1.0}, [t], {0: trainer_lps(t, 0.125)})
    tracker.log_step(2, {"step": 2.0, "reward/mean": 0.0}, [t, no_turn(qwen_tokenizer)])
    tracker.close()
    assert [
        json.loads(x)["step"] for x in (tmp_path / "metrics.jsonl").read_text().splitlines()
    ] == [1, 2]
    rows = [json.loads(x) for x in (tmp_path / "trajectories.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 2] and "trainer_logprobs" not in rows[1]
    back = trajectory_from_dict(rows[0])
    assert back == t
    (step, got, lps), = load_jsonl(tmp_path / "trajectories.jsonl", step=1)  # fmt: skip
    assert step == 1 and got == t and lps == trainer_lps(t, 0.125)
    assert len(load_jsonl(tmp_path / "trajectories.jsonl")) == 2  # default: the last step
    main([str(tmp_path), "--step", "1", "--tokenizer", str(qwen_tokenizer_dir)])
    assert 'class="t"' in (tmp_path / "view_1.html").read_text()
    with pytest.raises(SystemExit, match=r"no trajectories for step 7; it has steps \[1, 2\]"):
        main([str(tmp_path), "--step", "7", "--tokenizer", str(qwen_tokenizer_dir)])
    preview = tmp_path / "preview"  # `agentrl preview` writes trajectories without steps
    preview.mkdir()
    (preview / "trajectories.jsonl").write_text(t.to_json() + "\n")
    main([str(preview), "--tokenizer", str(qwen_tokenizer_dir)])
    assert 'class="t"' in (preview / "view_0.html").read_text()
    with pytest.raises(SystemExit, match=r"nosuch: no such file .* or a trajectories\.jsonl\)"):
        main([str(tmp_path / "nosuch")])  # names the file to give, not the folder it was given


def test_resolve_mode():
    assert resolve_mode("auto", {}) == "offline"
    assert resolve_mode("auto", {"WANDB_API_KEY": "k"}) == "online"
    assert resolve_mode("auto", {"WANDB_API_KEY": "k", "WANDB_MODE": "offline"}) == "offline"
    assert resolve_mode("auto", {"WANDB_MODE": "disabled"}) == "disabled"
    assert resolve_mode("offline", {"WANDB_API_KEY": "k"}) == "offline"


class BrokenRun:
    def __init__(self, *a, **kw):
        raise ConnectionError("no route to api.wandb.ai")


class FlakySink:
    name, required, calls = "wandb", False, 0

    def log(self, rec):
        FlakySink.calls += 1
        raise RuntimeError("disk full")

    def close(self, failed):
        pass


def test_wandb_failures_warn_once_and_training_goes_on(tmp_path, monkeypatch):
    monkeypatch.setattr(tracking, "WandbSink", BrokenRun)
    console = Console(record=True, width=300)
    tracker = Tracker(LoggingConfig(), tmp_path, run_id="abc123", console=console)
    assert tracker.wandb is None and tracker.run_id == "abc123"  # carried to the next checkpoint
    tracker.sinks.append(FlakySink())
    for step in (1, 2, 3):
        tracker.log_step(step, {"step": float(step)})
    tracker.close()
    out = console.export_text()
    assert out.count("W&B did not start (ConnectionError") == 1
    assert out.count("wandb logging failed at step 1 (disk full)") == 1 and FlakySink.calls == 1
    assert len((tmp_path / "metrics.jsonl").read_text().splitlines()) == 3


def test_progress_line():
    m = {"step": 3.0, "reward/mean": 0.25, "reward/max": 1.0, "rollout/tool_call_rate": 0.6,
         "rollout/turns": 1.4, "stop/completed": 14.0, "stop/aborted": 2.0, "stop/length": 0.0,
         "perf/sampled_tokens_per_s": 1234.0, "timing_s/rollout": 3.8, "timing_s/advantage": 0.01,
         "timing_s/update": 65.0, "timing_s/step": 68.81}  # fmt: skip
    text = progress_text(m, 20, eta_s=150.0).plain
    assert text.startswith("step  3/20 ━━")
    for part in ("reward 0.250 (max 1.00)", "tool-rate 0.60", "completed 14 aborted 2", "1.2k tok/s",
                 "roll 3.8s upd 1m05s = 1m08s", "eta 2m30s"):  # fmt: skip
        assert part in text, (part, text)
    assert "length" not in text and "advantage" not in text
    console = Console(record=True, width=40)
    ProgressLine(20, start_step=2, console=console)(m)
    assert len(console.export_text().splitlines()) == 1  # never wrapped: one line per step in logs


def test_reward_components_and_the_reference_answer_are_shown_to_people(qwen_tokenizer):
    from agentrl.display import trajectory_panel

    t = Trajectory(task_id="t1", sample_index=0, token_ids=[1, 2], loss_mask=[0, 0],
                   logprobs=[0.0, 0.0], prompt_len=2, turns=[],
                   messages=[Message(role="user", content="2+2?")],
                   stop_reason=StopReason.COMPLETED, reward=0.5,
                   reward_components={"correct": 0.0, "format": 0.5},
                   metadata={"reference": "4"})  # fmt: skip
    (row,) = turn_rows(1, [t])
    cols = dict(zip(TURN_COLUMNS, row, strict=True))
    assert json.loads(cols["reward_components"]) == {"correct": 0.0, "format": 0.5}
    assert cols["reference"] == "4"
    assert "correct=0, format=0.5 · reference &#x27;4&#x27;" in render_html([(1, t, None)],
                                                                          qwen_tokenizer)  # fmt: skip
    page = render_html([(1, t, None)], qwen_tokenizer)
    assert '<details class="pd"><summary>prompt (2 tokens' in page  # folded prompt
    assert gap_colour(1e-4) not in page.split("#vm:checked")[1].split("}")[0]  # two colourings
    console = Console(record=True, width=120)
    console.print(trajectory_panel(t))
    assert "correct=0, format=0.5 · reference '4'" in console.export_text()


def test_a_resumed_run_continues_its_files_and_a_fresh_one_archives_them(tmp_path):
    from agentrl.tracking import JsonlSink

    def write(name, steps, torn=False):
        rows = "".join(json.dumps({"step": s, "x": s}) + "\n" for s in steps)
        (tmp_path / name).write_text(rows + ('{"step": 9, "x' if torn else ""))

    write("metrics.jsonl", [1.0, 2.0, 3.0, 4.0], torn=True)  # killed mid-write after step 4
    write("trajectories.jsonl", [1, 1, 2, 2, 3, 4])
    note = JsonlSink.continue_run(tmp_path, 2)  # the last checkpoint is step 2
    assert "moved to" in note
    steps = [json.loads(x)["step"] for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1.0, 2.0]
    traj = (tmp_path / "trajectories.jsonl").read_text().splitlines()
    assert [json.loads(x)["step"] for x in traj] == [1, 1, 2, 2]
    (archive,) = (tmp_path / "archive").iterdir()  # nothing lost: the later lines are kept there
    assert len((archive / "metrics.jsonl").read_text().splitlines()) == 3  # steps 3, 4, torn
    assert len((archive / "trajectories.jsonl").read_text().splitlines()) == 2
    assert JsonlSink.continue_run(tmp_path, 2) is None  # nothing after step 2 any more
    # a fresh start in the same dir (checkpoint.resume=never) moves the earlier run aside
    note = JsonlSink.continue_run(tmp_path, None)
    assert "moved to" in note
    assert (
        not (tmp_path / "metrics.jsonl").exists() and not (tmp_path / "trajectories.jsonl").exists()
    )
    assert JsonlSink.continue_run(tmp_path / "new", None) is None


def test_an_aborted_episode_keeps_its_traceback_in_trajectories_jsonl(tmp_path, qwen_tokenizer_dir):
    from transformers import AutoTokenizer

    from agentrl.tracking import JsonlSink, StepRecord

    tok = AutoTokenizer.from_pretrained(qwen_tokenizer_dir)
    t = two_turns(tok, stop=StopReason.ABORTED)
    t.error = 'Traceback (most recent call last):\n  File "env.py", line 3\nKeyError: "answer"'
    JsonlSink(tmp_path).log(StepRecord(step=3, metrics={"step": 3.0}, trajs=[t]))
    (row,) = [json.loads(x) for x in (tmp_path / "trajectories.jsonl").read_text().splitlines()]
    assert row["step"] == 3 and row["stop_reason"] == "aborted"
    assert row["error"].startswith("Traceback") and 'KeyError: "answer"' in row["error"]
    assert trajectory_from_dict(row).error == t.error  # the viewer reads it back


def test_segments_must_cover_their_turn(qwen_tokenizer):
    t = two_turns(qwen_tokenizer)
    assert t.turns[1].token_versions() == ["0"] + ["1"] * (t.turns[1].end - t.turns[1].start - 1)
    t.turns[1].segments = [(1, "0")]
    with pytest.raises(ValueError, match="has segments"):
        t.check()


def test_an_update_at_the_memory_edge_is_warned_about_and_documented():
    import agentrl.metrics
    from agentrl.update_health import memory_edge

    assert memory_edge({"policy/alloc_retries": 0.0}) is None
    assert memory_edge({}) is None  # a CPU learner never reports retries
    msg = memory_edge({"policy/alloc_retries": 3.0})
    assert msg is not None and "3 time(s)" in msg and "learner.micro_batch_tokens" in msg
    assert metric_name("policy/alloc_retries") in agentrl.metrics.__doc__
    # where it retried decides the advice: the micro-batch size cannot help the optimizer step
    msg = memory_edge({"policy/alloc_retries": 2.0, "policy/alloc_retries_optimizer": 2.0})
    assert msg is not None and "2 of them in the optimizer step" in msg
    assert "micro_batch_tokens" not in msg and "--mem-fraction-static" in msg
    assert metric_name("policy/alloc_retries_optimizer") in agentrl.metrics.__doc__


def test_the_runs_summary_line_averages_its_first_and_last_steps():
    """A new user read the quick start's last step (a dip: 0.734, the last five 0.847) as the
    result: the line averages up to 5 steps at each end, and says so."""
    from agentrl.train import summary_line

    history = [{"reward/mean": r, "rollout/tool_call_rate": 0.5} for r in
               [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.9, 1.0, 1.0, 1.0, 0.9, 0.7]]  # fmt: skip
    line = summary_line(history)
    assert line.startswith("done: 12 steps, reward 0.300 → 0.920, tool_call_rate 0.50 → 0.50")
    assert "first and of the last 5 steps" in line
    assert "reward 0.100 → 0.100" in summary_line(history[:1])


def test_under_dynamic_sampling_the_console_shows_every_sampled_episodes_reward():
    """An audit: dynamic sampling keeps the groups whose rewards differ, so reward/mean (theirs)
    sat near 0.5 while the policy's reward was elsewhere; the step line and the done: line show
    reward/mean_all, the kept groups' mean beside it."""
    from agentrl.train import summary_line

    m = {"step": 3.0, "reward/mean": 0.5, "reward/max": 1.0, "reward/mean_all": 0.125,
         "reward/max_all": 1.0, "reward/std_all": 0.33}  # fmt: skip
    text = progress_text(m, 20).plain
    assert "reward 0.125 (kept groups 0.500, max 1.00) tool-rate" in text
    history = [{**m, "reward/mean_all": r} for r in (0.1, 0.2)]
    assert summary_line(history).startswith("done: 2 steps, reward 0.100 → 0.200")
    mix = {**m, "env/code/reward_mean": 0.5, "env/code/reward_mean_all": 0.25}
    assert "│ code 0.25 " in progress_text(mix, 20).plain + " "


def test_the_summary_line_counts_the_steps_without_learning_signal():
    """A red-team audit: `done: 3 steps, reward 0.000 → 0.125` read as progress from a run in
    which no step carried gradient."""
    from agentrl.train import summary_line

    rows = [{"reward/mean": r, "train/no_signal_steps_in_a_row": n}
            for r, n in [(0.0, 1.0), (0.0, 2.0), (0.25, 3.0)]]  # fmt: skip
    assert summary_line(rows).endswith("; 3 of 3 steps had no learning signal (every advantage 0)")
    rows[1]["train/no_signal_steps_in_a_row"] = 0.0
    assert "; 2 of 3 steps had no learning signal" in summary_line(rows)
    assert "learning signal" not in summary_line([{"reward/mean": 0.5}])
