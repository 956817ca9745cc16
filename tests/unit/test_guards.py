"""Run health (agentrl/guards.py) on made-up steps: each counter counts, resets and stops where
its setting says; every warning reaches the console and the tracker's alerts. The judgement of
signal per mode is tests/unit/test_mode_matrix.py; the real runs tests/e2e/test_empty_steps.py,
test_train_failures.py and test_train.py -k "crash or diverg"."""

from __future__ import annotations

import io

import pytest
from rich.console import Console

from agentrl.advantage import AdvantageConfig
from agentrl.guards import Guards, Limits, Signal
from agentrl.types import FinishReason, Message, StopReason, TrainingError, Trajectory, Turn


def episode(reward: float, stop: StopReason = StopReason.COMPLETED, i: int = 0) -> Trajectory:
    turn = Turn(start=1, end=2, obs_end=2, weight_version="0", finish_reason=FinishReason.STOP,
                assistant=Message(role="assistant", content="x"))  # fmt: skip
    return Trajectory(task_id="t", sample_index=i, token_ids=[1, 2], loss_mask=[0, 1],
                      logprobs=[0.0, -1.0], prompt_len=1, turns=[turn], messages=[],
                      stop_reason=stop, reward=reward, error="Traceback: boom")  # fmt: skip


def guards(**limits) -> tuple[Guards, list[str], io.StringIO]:
    alerts: list[str] = []
    out = io.StringIO()
    given = dict(max_aborted_frac=0.25, max_empty_steps=2, no_signal_steps=2, max_skipped_steps=2,
                 warn_logprob_gap=0.5, warn_tool_fail_rate=0.5) | limits  # fmt: skip
    g = Guards(Limits(**given), Signal(AdvantageConfig(name="grpo")),
               Console(file=out, width=2000), lambda title, msg: alerts.append(title))  # fmt: skip
    return g, alerts, out


def test_crashed_episodes_above_the_bar_stop_with_one_of_them():
    g, _, _ = guards()
    crash = StopReason.REWARD_ERROR
    g.check_crashes([episode(1.0, crash), *[episode(0.0)] * 3], step=2)  # 1 of 4: at the bar
    with pytest.raises(TrainingError, match=r"2 of 4 episodes of step 3 crashed[\s\S]*boom"):
        g.check_crashes([episode(1.0, crash)] * 2 + [episode(0.0)] * 2, step=3)


def test_empty_steps_are_skipped_counted_and_stop_the_run_in_a_row():
    g, _, out = guards()
    lost = [episode(1.0, StopReason.ABORTED)]
    assert not g.trainable(lost, m := {}, step=1) and m["train/empty_steps_in_a_row"] == 1
    assert "step 1: no trajectory to train on" in out.getvalue()
    assert g.trainable([episode(1.0)], m, step=2) and m["train/empty_steps_in_a_row"] == 0
    assert not g.trainable(lost, m, step=3)
    with pytest.raises(TrainingError, match="2 steps in a row had no trajectory"):
        g.trainable(lost, m, step=4)


def test_no_signal_is_warned_every_n_flat_steps_and_a_live_group_resets_it():
    g, alerts, _ = guards()
    flat, live = [episode(1.0), episode(1.0, i=1)], [episode(1.0), episode(0.0, i=1)]
    assert g.keep(live) and not g.keep(flat)
    for _ in range(3):
        g.watch_signal([flat], m := {})
    assert m["train/no_signal_steps_in_a_row"] == 3 and alerts == ["no learning signal"]
    g.watch_signal([flat, live], m)
    assert m["train/no_signal_steps_in_a_row"] == 0


def test_no_signal_names_truncation_from_the_start_and_groups_of_one_text():
    """A red-team audit: with rollout.max_new_tokens=4 (every episode cut from step 1) one
    lucky success made the warning say the policy collapsed; with a nearly greedy temperature
    (every group one text) it blamed the tools or the task."""
    g, _, out = guards()
    cut = [episode(0.0, StopReason.LENGTH), episode(0.0, StopReason.LENGTH, i=1)]
    g.watch_signal([[episode(1.0, StopReason.LENGTH), episode(0.0, StopReason.LENGTH, i=1)]], {})
    for _ in range(2):
        g.watch_signal([cut], {})
    said = out.getvalue()
    assert "were at step 1: raise rollout.max_new_tokens" in said and "collapsed" not in said
    g, _, out = guards()
    for _ in range(2):
        g.watch_signal([[episode(0.0), episode(0.0, i=1)]], {})
    assert "Every group's samples are the same text" in out.getvalue()
    g, _, out = guards()
    other = episode(0.0, i=1)
    other.token_ids = [1, 3]
    for _ in range(2):
        g.watch_signal([[episode(0.0), other]], {})
    assert "no learning signal" in out.getvalue() and "same text" not in out.getvalue()


def test_a_policy_that_collapsed_after_learning_is_named_in_the_no_signal_warning():
    """A new user's learner.lr=5: signal at step 1, then every episode ran to the token limit
    with reward 0, and the warning's causes (never calls the tools, too easy) pointed away."""
    g, _, out = guards()
    g.watch_signal([[episode(1.0), episode(0.0, i=1)]], {})
    cut = [episode(0.0, StopReason.LENGTH), episode(0.0, StopReason.LENGTH, i=1)]
    for _ in range(2):
        g.watch_signal([cut], {})
    assert "100% of the episodes run to the token limit" in out.getvalue()
    assert "the policy collapsed; check learner.lr" in out.getvalue()
    fresh, _, out = guards()  # never had signal: the usual causes only
    for _ in range(2):
        fresh.watch_signal([cut], {})
    assert "no learning signal" in out.getvalue() and "collapsed" not in out.getvalue()


def test_non_finite_optimizer_steps_in_a_row_stop_the_run():
    g, _, _ = guards()
    g.count_skip({"policy/skipped": 1.0})
    g.count_skip({"policy/skipped": 0.0})
    assert g.skipped_in_a_row == 0
    g.count_skip({"critic/skipped": 1.0})
    with pytest.raises(TrainingError, match="2 optimizer steps in a row had a non-finite loss"):
        g.count_skip({"policy/skipped": 1.0, "policy/grad_norm": float("nan")})


def test_skipped_optimizer_steps_that_alternate_with_good_ones_are_warned():
    """Every other optimizer step non-finite never makes max_skipped_steps in a row: half the
    updates trained nothing with only train/skipped to show it. 3 of the last 10 are warned,
    once per 10 steps."""
    g, alerts, out = guards()
    for k in range(20):
        g.count_skip({"policy/skipped": float(k % 2)})
    assert alerts == ["optimizer steps skipped"] * 2
    assert "of the last 10 optimizer steps had a non-finite loss" in out.getvalue()
    rare, alerts, _ = guards()
    for k in range(30):
        rare.count_skip({"policy/skipped": float(k % 5 == 0)})  # 2 of 10: no warning
    assert alerts == []


def test_after_the_update_memory_and_the_logprob_gap_are_warned():
    g, alerts, out = guards()
    g.watch_update({"train/logprob_diff": 0.4}, step=1, stale=False)
    assert alerts == []
    g.watch_update({"train/logprob_diff": 0.6, "policy/alloc_retries": 2}, step=2, stale=False)
    assert alerts == ["learner memory at its limit", "engine and trainer disagree"]
    g.watch_update({"train/logprob_diff": 9.0}, step=3, stale=True)  # async: stale by design
    assert len(alerts) == 2 and "warning:" in out.getvalue()


def test_sync_turns_from_other_weights_are_counted_and_warned():
    g, alerts, _ = guards(no_signal_steps=0)  # one-member groups: never any signal
    g.after_rollout([[episode(1.0)]], [episode(1.0)], m := {}, step=1, sync=True)
    assert m["rollout/off_version_turns"] == 0 and alerts == []
    g.after_rollout([[episode(1.0)]], [episode(1.0)], m := {}, step=2, sync=True)  # "0" != "1"
    assert m["rollout/off_version_turns"] == 1 and alerts == ["engine serves old weights"]
    g.after_rollout([[episode(1.0)]], [episode(1.0)], m := {}, step=2, sync=False)
    assert "rollout/off_version_turns" not in m


def test_a_warning_reaches_the_terminal_once_and_the_log_file_too(tmp_path, capsys):
    """The console prints a guard's warning; the run's terminal log handlers (and Python's
    last-resort one) leave it out, a file handler keeps it."""
    import logging
    import sys

    from agentrl.display import make_console

    root = logging.getLogger()
    term, file = logging.StreamHandler(sys.stderr), logging.FileHandler(tmp_path / "run.log")
    root.addHandler(term)
    root.addHandler(file)
    try:
        make_console()  # a run's start: the terminal handlers learn to skip shown records
        g, alerts, out = guards()
        g.watch_update({"policy/alloc_retries": 2.0}, step=1, stale=False)
        logging.getLogger("agentrl.other").warning("not shown by the console")
    finally:
        root.removeHandler(term)
        root.removeHandler(file)
        file.close()
    assert out.getvalue().count("ran out of cached memory 2 time(s)") == 1
    err = capsys.readouterr().err
    assert "ran out of cached memory" not in err and "not shown by the console" in err
    assert "ran out of cached memory 2 time(s)" in (tmp_path / "run.log").read_text()
    assert alerts == ["learner memory at its limit"]


def test_one_reward_for_every_episode_is_warned_where_a_critic_hides_it():
    """A red-team audit: PPO on an all-0 reward (the critic's values make every advantage
    non-zero, so `carries` said yes) updated on noise without a word."""
    alerts: list[str] = []
    out = io.StringIO()
    g = Guards(Limits(max_aborted_frac=0.25, max_empty_steps=2, no_signal_steps=2,
                      max_skipped_steps=2, warn_logprob_gap=0.5, warn_tool_fail_rate=0.5),
               Signal(AdvantageConfig(name="gae")), Console(file=out, width=2000),
               lambda title, msg: alerts.append(title))  # fmt: skip
    zero = [episode(0.0), episode(0.0, i=1)]
    for _ in range(2):
        g.watch_signal([zero], {})
    assert alerts == ["one reward for every episode"] and "critic's values" in out.getvalue()
    g.watch_signal([[episode(0.0), episode(1.0, i=1)]], {})
    assert g.one_reward_in_a_row == 0


def test_a_kl_reward_penalty_that_outweighs_the_rewards_is_warned_every_n_steps_in_a_row():
    """An audit: algo.loss.kl_coef large under kl_mode=reward trained on the KL alone, silently."""
    g, alerts, out = guards()  # no_signal_steps=2
    drowned = {"train/kl_reward_penalty": 5.0, "reward/std": 0.4}  # 12x the rewards' spread
    g.watch_update({"train/kl_reward_penalty": 0.3, "reward/std": 0.4}, step=1, stale=False)
    g.watch_update(drowned, step=2, stale=False)
    assert alerts == []  # one step alone is not yet a pattern
    g.watch_update(dict(drowned), step=3, stale=False)
    assert alerts == ["KL outweighs the reward"]
    assert "2 steps in a row" in out.getvalue() and "Lower algo.loss.kl_coef" in out.getvalue()
    g.watch_update({"train/kl_reward_penalty": 5.0, "reward/std": 0.0}, step=4, stale=False)
    g.watch_update(dict(drowned), step=5, stale=False)  # one reward for all reset the count
    assert alerts == ["KL outweighs the reward"]


def test_a_task_whose_first_prompt_fits_no_turn_is_warned_once():
    """An audit: such a task's every episode stopped at once, scored 0 with nothing to train on,
    and nothing said why. Warned from the step's groups and from those dynamic sampling drops."""
    g, alerts, out = guards(no_signal_steps=0)
    long = episode(0.0, StopReason.CONTEXT_OVERFLOW)
    long.turns, long.task_id = [], "big"
    long.error = "task 'big': its first prompt is 3000 tokens, rollout.max_context_tokens=2048"
    cut = episode(0.0, StopReason.CONTEXT_OVERFLOW)  # overflowed later: the budget did its job
    g.after_rollout([[cut]], [cut], {}, step=1, sync=False)
    assert alerts == []
    g.after_rollout([[long, long], [cut]], [long, long, cut], {}, step=2, sync=False)
    assert alerts == ["prompt longer than the context"]
    said = out.getvalue()
    assert "1 task(s) ('big') cannot start: task 'big': its first prompt is 3000 tokens" in said
    assert "Raise rollout.max_context_tokens" in said
    assert not g.keep([long, long]) and len(alerts) == 1  # once per task
    other = episode(0.0, StopReason.CONTEXT_OVERFLOW)
    other.turns, other.task_id = [], "other"
    assert not g.keep([other, other]) and len(alerts) == 2  # a dropped group's task is news


def test_a_rollout_correction_that_masks_most_tokens_is_warned_every_n_steps_in_a_row():
    """An audit: algo.loss.rollout_correction=mis with mis_low=0.99, mis_high=1.01 masked most
    sampled tokens (engine and trainer differ by a few % a token in bf16): the advantages were
    not 0 and the logprob gap under its 0.1 bar, so the run trained on a few tokens a step
    without a word. Async too, where the gap is not checked."""
    g, alerts, out = guards()  # no_signal_steps=2
    masked = {"policy/is_masked_frac": 0.8, "policy/rollout_logprob_diff": 0.03}
    g.watch_update({"policy/is_masked_frac": 0.1}, step=1, stale=False)
    g.watch_update(dict(masked), step=2, stale=True)
    assert alerts == []  # one step alone is not yet a pattern
    g.watch_update(dict(masked), step=3, stale=True)
    assert alerts == ["rollout correction masks most tokens"]
    said = out.getvalue()
    assert "masked 80% of the sampled tokens" in said and "0.03 a token" in said
    assert "algo.loss.mis_low" in said and "rollout_correction=tis" in said
    g.watch_update({"policy/is_masked_frac": 0.2}, step=4, stale=False)  # the count restarts
    g.watch_update(dict(masked), step=5, stale=False)
    assert alerts == ["rollout correction masks most tokens"]


@pytest.mark.parametrize("stop", [StopReason.MAX_TURNS, StopReason.PARSE_ERROR])
def test_no_signal_names_episodes_out_of_turns_or_of_parsable_calls(stop):
    """An audit: rollout.max_turns=1 with a tool env (every tool result came back with no turn
    left to answer), or a parser that did not match the model's calls, scored every episode 0;
    the warning blamed the model or the task."""
    g, _, out = guards()
    ended = episode(0.0, stop)
    other = episode(0.0, stop, i=1)
    other.token_ids = [1, 3]
    for _ in range(2):
        g.watch_signal([[ended, other]], {})
    said = out.getvalue()
    assert f"100% of the episodes end with stop/{stop.value}" in said
    assert ("raise rollout.max_turns" if stop is StopReason.MAX_TURNS else "rollout.parser") in said
