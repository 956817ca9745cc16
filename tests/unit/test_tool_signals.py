"""Failure signals in view (issue 38: 8). A failed tool call is not a tool call in
`num_tool_calls` (a reward that pays for "used a tool" must not pay for failures); calls and
failures per tool name are metrics (`tools/<name>/*`, `eval/tools/<name>/*`); the step and eval
lines show the reward's components and the tools whose calls failed; a tool failing on most of
its calls is warned about at once, then every few steps while it lasts. All on hand-built
records: no engine, no tokenizer."""

from __future__ import annotations

import asyncio

from pydantic import BaseModel

from agentrl import Message, Task, Tool, ToolEnv, ToolResult
from agentrl.display import eval_text, progress_text
from agentrl.env import AssistantTurn
from agentrl.evaluate import evaluate
from agentrl.metrics import TOOL_WARN_EVERY, TOOL_WARN_MIN_CALLS, ToolWatch, rollout_metrics
from agentrl.parsers import ParseError, ParseErrorKind
from agentrl.trainer_config import GuardsConfig
from agentrl.trajectory_view import pick
from agentrl.types import FinishReason, StopReason, ToolCall, ToolOutcome, Trajectory, Turn

OK = ToolOutcome("python")
ERR = ToolOutcome("python", "error", "Error: NameError: name 'x' is not defined")
EXC = ToolOutcome("python", "exception", "Error: tool 'python' failed: KeyError: 'api'")


def turn(start: int, outcomes: list[ToolOutcome], parse_errors: int = 0) -> Turn:
    """A turn of 2 sampled ids and 1 observation id, with these tool calls."""
    ok, err, exc = (sum(o.status == s for o in outcomes) for s in ("ok", "error", "exception"))
    return Turn(start, start + 2, start + 3, "0", FinishReason.STOP,
                Message(role="assistant", content="..."), num_tool_calls=ok,
                num_tool_errors=err, num_tool_exceptions=exc, tool_outcomes=list(outcomes),
                num_parse_errors=parse_errors, tool_latency_s=0.5)  # fmt: skip


def episode(*turn_outcomes: list[ToolOutcome], reward: float = 1.0, sample: int = 0) -> Trajectory:
    """Prompt of 2 ids, then one turn per list of outcomes."""
    turns, pos = [], 2
    for outcomes in turn_outcomes:
        turns.append(turn(pos, outcomes))
        pos += 3
    mask = [0, 0] + [1, 1, 0] * len(turns)
    return Trajectory("t", sample, list(range(pos)), mask, [0.0] * pos, 2, turns,
                      [Message(role="user", content="q")], StopReason.COMPLETED, reward=reward,
                      reward_components={"total": reward, "correct": reward, "format": 1.0})  # fmt: skip


# -- the record: num_tool_calls counts calls that worked ------------------------------------------
class Args(BaseModel):
    x: int = 0


class Flaky(Tool):
    name, description, Args = "flaky", "raises on x=1", Args

    async def __call__(self, args, ctx):
        if args.x == 1:
            raise KeyError("api")
        return ToolResult(content="fine")


class FlakyEnv(ToolEnv):
    tools = [Flaky()]


def test_a_failed_call_is_not_a_tool_call():
    """One call works, one raises in the tool, one has bad arguments, one names a tool the env
    does not have (refused by the parser): 1 call, 2 errors of the model's, 1 exception."""
    env = FlakyEnv(Task(id="t", data={"prompt": "hi"}))
    calls = [ToolCall(id=f"c{x}", name="flaky", arguments={"x": x}) for x in (0, 1)]
    calls.append(ToolCall(id="c2", name="flaky", arguments={"x": "NaN"}))
    unknown = ParseError(ParseErrorKind.UNKNOWN_TOOL, "unknown tool 'search'", name="search")
    said = AssistantTurn(Message(role="assistant", tool_calls=calls), "", [unknown])
    res = asyncio.run(env.step(said))
    assert res.tool_counts() == (res.tool_calls, res.tool_errors, res.tool_exceptions) == (1, 2, 1)
    assert [(o.name, o.status) for o in res.tool_outcomes] == [
        ("(unknown)", "error"), ("flaky", "ok"), ("flaky", "exception"), ("flaky", "error"),
    ]  # fmt: skip
    assert "KeyError" in res.tool_outcomes[2].message and res.tool_outcomes[1].message == ""
    assert not res.done  # one call worked: no tool_error streak


def test_a_step_that_reports_only_counts_still_counts():
    from agentrl.env import StepResult

    assert StepResult(tool_calls=1, tool_errors=2).tool_counts() == (1, 2, 0)
    given = StepResult(tool_calls=9, tool_outcomes=[OK, EXC])  # the outcomes win
    assert given.tool_counts() == (1, 0, 1)


def test_trajectory_counts_and_the_jsonl_record_both_ways():
    tr = episode([OK, ERR], [EXC], [OK])
    assert (tr.num_tool_calls, tr.num_tool_failures, tr.num_tool_attempts) == (2, 2, 4)
    again = Trajectory.from_dict(tr.to_dict())
    assert again.turns[0].tool_outcomes == [OK, ERR] and again.num_tool_calls == 2
    # a line written before tool_outcomes existed: num_tool_calls counted every attempt
    old = tr.to_dict()
    for t in old["turns"]:
        t["num_tool_calls"] = t["num_tool_calls"] + t["num_tool_errors"] + t["num_tool_exceptions"]
        del t["tool_outcomes"]
    read = Trajectory.from_dict(old)
    assert [t.num_tool_calls for t in read.turns] == [1, 0, 1] and read.num_tool_attempts == 4


# -- metrics --------------------------------------------------------------------------------------
def test_per_tool_metrics_by_hand():
    other = [ToolOutcome("search"), ToolOutcome("search", "error", "Error: no such page")]
    a = episode([OK, ERR], [EXC], [OK])
    b = episode([EXC, EXC, *other], [], sample=1)  # a turn without calls
    m = rollout_metrics([a, b])
    assert m["rollout/tool_calls"] == (2 + 1) / 2  # succeeded, per trajectory
    assert (m["rollout/tool_errors"], m["rollout/tool_exceptions"]) == (2 / 2, 3 / 2)
    assert m["rollout/tool_call_rate"] == 4 / 5  # the turn of only an exception tried too
    assert m["rollout/tool_latency_s"] == 0.5
    py = {k.split("/")[-1]: v for k, v in m.items() if k.startswith("tools/python/")}
    assert py == {"calls": 6.0, "errors": 1.0, "exceptions": 3.0, "fail_rate": 4 / 6}
    assert (m["tools/search/calls"], m["tools/search/errors"]) == (2.0, 1.0)
    assert m["tools/search/exceptions"] == 0.0 and m["tools/search/fail_rate"] == 0.5
    busy, worst = episode([EXC] * 4 + [OK], reward=0.5), episode([OK], reward=0.0)
    # best, worst, then most calls made: busy's 4 failed + 1 worked beat a's 2 + 2
    assert pick([a, episode([], reward=0.5), busy, worst], None, 3) == [0, 3, 2]


async def test_eval_metrics_have_the_tool_numbers_too():
    class Fake:
        async def run_group(self, task, n):
            return [episode([OK, EXC], reward=0.5, sample=i) for i in range(n)]

    out, trajs = await evaluate(Fake(), [Task(id="t")], samples=2)
    assert out["eval/tools/python/calls"] == 4 and out["eval/tools/python/exceptions"] == 2
    assert out["eval/tool_calls"] == 1 and out["eval/tool_exceptions"] == 1
    assert out["eval/reward_correct"] == 0.5 and out["eval/reward_format"] == 1.0


# -- the console ----------------------------------------------------------------------------------
def test_the_step_line_shows_components_and_the_tools_that_failed():
    m = {"step": 3.0, **rollout_metrics([episode([OK, ERR], [EXC], [OK], reward=0.5)])}
    text = progress_text(m, 20).plain
    assert "reward 0.500 (max 0.50; correct 0.50 format 1.00)" in text, text
    assert "│ python 4 calls: err 1 exc 1 │" in text + " │", text
    clean = {"step": 3.0, **rollout_metrics([episode([OK], reward=0.5)])}
    clean = {k: v for k, v in clean.items() if not k.startswith("reward/") or k == "reward/mean"}
    text = progress_text(clean, 20).plain
    assert "calls" not in text and "err" not in text and "(max nan)" in text  # nothing to say
    # an env whose own step gives counts only: the means per episode
    counts = {"step": 1.0, "rollout/tool_errors": 0.25, "rollout/tool_exceptions": 0.0}
    assert "│ tool err 0.25 /episode" in progress_text(counts, 20).plain


def test_the_eval_line_shows_them_too():
    out = {"eval/reward_mean": 0.45, "eval/reward_std": 0.3, "eval/reward_correct": 0.45,
           "eval/timing_s": 3.14, "eval/tools/python/calls": 128.0,
           "eval/tools/python/errors": 12.0, "eval/tools/python/exceptions": 0.0}  # fmt: skip
    text = eval_text(out, 10, 32, 4).plain
    assert text == "eval after step 10: reward 0.450 (correct 0.45) over 32 tasks x 4 (3.1 s) │ " \
        "python 128 calls: err 12"  # fmt: skip


# -- the warning ----------------------------------------------------------------------------------
def step_of(failed: int, calls: int, kind: ToolOutcome = EXC) -> list[Trajectory]:
    return [episode([kind] * failed + [OK] * (calls - failed))]


def test_a_failing_tool_is_warned_at_once_then_every_n_steps_and_its_recovery_noted():
    watch = ToolWatch(bar=0.5)
    said = {}
    for step in range(1, 26):
        trajs = step_of(30, 40)  # 75 % raise, every step
        if step == 12:
            trajs = step_of(5, 5)  # too few calls to judge: no change either way
        if step == 13:
            trajs = step_of(2, 40)  # recovered
        metrics, warnings, notes = watch.update(trajs, step)
        said[step] = (metrics["rollout/failing_tools"], warnings, notes)
    warned = [s for s, (_, w, _) in said.items() if w]
    assert warned == [1, 1 + TOOL_WARN_EVERY, 14, 14 + TOOL_WARN_EVERY]
    (first,) = said[1][1]
    assert "tool 'python' failed on 30 of 40 calls in step 1" in first
    assert "30 raised in the tool, 0 were the model's errors" in first
    assert "KeyError: 'api'" in first and "traceback is in the log" in first
    assert "still fails: 30 of 40 calls in step 11 (since step 1)" in said[11][1][0]
    assert said[12] == (0.0, [], []) and said[2][0] == 1.0
    assert said[13][2] == ["tool 'python' recovered at step 13: 2 of 40 calls failed (failing "
                           "since step 1)"]  # fmt: skip
    assert said[13][0] == 0.0


def test_the_warning_says_whose_fault_and_holds_back_below_its_bars():
    (msg,) = ToolWatch(bar=0.5).update(step_of(6, 8, ERR), step=1)[1]
    assert "Mostly the model's calls failing" in msg and "NameError" in msg
    assert not ToolWatch(bar=0.5).update(step_of(4, 8), step=1)[1]  # 50 %: not above
    few = TOOL_WARN_MIN_CALLS - 1
    assert not ToolWatch(bar=0.5).update(step_of(few, few), step=1)[1]
    assert ToolWatch(bar=0.0).update(step_of(8, 8), step=1) == ({"rollout/failing_tools": 0.0},
                                                                [], [])  # fmt: skip


def test_the_setting_says_the_numbers_the_code_uses():
    text = GuardsConfig.model_fields["warn_tool_fail_rate"].description
    assert f"{TOOL_WARN_MIN_CALLS} calls at least" in text and f"every {TOOL_WARN_EVERY} " in text


def test_the_trainer_warns_on_the_console_and_as_an_alert_and_counts_the_tool():
    """Guards.watch_tools, the glue: the metric, the warning (tool text printed as text, never
    as console markup), the W&B alert; a fake tracker, no run."""
    from rich.console import Console

    from agentrl.config import Config
    from agentrl.train import make_guards

    alerts = []
    cfg = Config(env={"_target_": "agentrl.envs.code_exec:CodeExecEnv"},
                 trainer={"guards": {"warn_tool_fail_rate": 0.5}})  # fmt: skip
    console = Console(record=True, width=2000)
    guards = make_guards(cfg, console, lambda title, msg: alerts.append(title))
    metrics = {}
    marked = ToolOutcome("python", "exception", "Error: [bold]KeyError[/bold]")
    guards.watch_tools(step_of(8, 8, marked), metrics, step=5)
    assert metrics == {"rollout/failing_tools": 1.0} and alerts == ["tool failing"]
    out = console.export_text()
    assert "warning: tool 'python' failed on 8 of 8 calls in step 5" in out
    assert "[bold]KeyError[/bold]" in out
