"""The Env contract users extend: the message layer of an episode.

One Env instance runs one episode. The framework (agentrl.rollout) owns the token layer —
rendering, sampling, parsing tool calls, budgets, masks — and calls, in order:

    messages = await env.start()                 # system + user messages of the task
    loop:  result = await env.step(turn)         # turn: the parsed assistant message
           (result.messages are appended; the episode ends when result.done or a limit hits)
    reward = await env.reward(trajectory)        # float, or {"total": …, other components}
    await env.close()                            # always, also after errors

The common case lists tools and defines `reward`; the default `step` runs the turn's tool calls
(concurrently) and ends the episode on a turn without calls, or after a call whose result says
`ends_episode` (a `submit` tool, agentrl/tools/submit.py). A complete env (copy, paste, run
with `agentrl preview env=custom env._target_=my_module.AddEnv`):

    from pydantic import BaseModel
    from agentrl.env import ToolEnv
    from agentrl.tool import Tool, ToolContext, ToolResult
    from agentrl.types import Task

    class Add(Tool):
        name, description = "add", "Add two integers."
        class Args(BaseModel):
            a: int
            b: int
        async def __call__(self, args, ctx: ToolContext) -> ToolResult:
            return ToolResult(content=str(args.a + args.b))

    class AddEnv(ToolEnv):
        tools = [Add()]
        max_turns = 4
        system_prompt = "Use the add tool, then reply with the number only."

        @classmethod
        def load_tasks(cls, n: int = 100, seed: int = 0) -> list[Task]:
            return [Task(id=str(i), data={"prompt": f"What is {i} + {i + 1}?", "answer": str(2 * i + 1)})
                    for i in range(n)]

        async def reward(self, trajectory) -> float:
            return float(self.final_text(trajectory).strip() == self.task.data["answer"])

Errors: a tool's bad arguments, timeout or exception is a tool message the model reads (counted);
a malformed tool call is an error observation (counted); `max_parse_errors` turns in a row of only
malformed calls end the episode with `parse_error`. A well-formed call with bad arguments (or to
an unknown tool) is a tool error the model reads; tool argument models refuse extra keys unless
they say otherwise (`model_config = ConfigDict(extra="allow")`). An exception raised by `start`
ends that episode with `aborted` (left out of the baseline, counted against
`trainer.guards.max_aborted_frac` with its traceback); one raised by `step` on the policy's turn
ends it with `env_error`, and one raised by `reward` (or a reward that is not a number) with
`reward_error` (both scored 0, kept in its group, visible). The rest of its group goes on.
Each call is counted once (`Turn`, agentrl/types.py): `num_tool_calls` the ones that
succeeded (what a reward for "used the tool" should read: a failed call must not pay),
`num_tool_errors` the model's failures, `num_tool_exceptions` the tool's; per tool name in
`Turn.tool_outcomes` and the `tools/<name>/*` metrics.
`start`, `step`, `reward` and `close` may be plain `def`s: they then run in a worker thread (as a
tool's plain `def __call__` does), so blocking work in them cannot stall the other episodes.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import logging
import math
import traceback
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, ClassVar

from pydantic import Field

from agentrl.parsers import ParseError
from agentrl.render import RenderError
from agentrl.repeats import warn_episode
from agentrl.sandbox.base import SandboxUnavailable
from agentrl.task_file import read_tasks
from agentrl.tool import Tool, ToolContext, ToolResult, gather_all
from agentrl.types import (
    TRUNCATED_STOPS,
    ConfigError,
    EnvStepError,
    FinishReason,
    Message,
    StopReason,
    Task,
    ToolCall,
    ToolOutcome,
    Trajectory,
    Turn,
    tally,
    unawaited,
)


@dataclass
class AssistantTurn:
    """What the model said in one turn, parsed. `message.tool_calls` holds only valid calls."""

    message: Message
    text: str
    parse_errors: list[ParseError] = field(default_factory=list)
    finish_reason: FinishReason = FinishReason.STOP
    index: int = 0


@dataclass
class StepResult:
    """What the env answers to one assistant turn."""

    messages: list[Message] = field(default_factory=list)
    done: bool = False
    reward: float | None = None  # optional per-turn reward (for turn-level credit assignment)
    stop_reason: StopReason | None = None  # when done; default `completed`
    # the turn's tool calls, three disjoint counts (Turn's num_tool_* fields, types.py); an env
    # that gives `tool_outcomes` (one per call, named: the default `step` does) has them read
    # from there, the three numbers are then ignored
    tool_calls: int = 0  # calls that ran and succeeded
    tool_errors: int = 0  # calls that failed by the model's fault (bad arguments, its code)
    tool_exceptions: int = 0  # calls that failed by the tool's fault (its own code raised)
    tool_outcomes: list[ToolOutcome] = field(default_factory=list)
    tool_latency_s: float = 0.0

    def tool_counts(self) -> tuple[int, int, int]:
        """(succeeded, the model's errors, the tool's exceptions) of this turn's calls."""
        if self.tool_outcomes:
            return tally(self.tool_outcomes)
        return self.tool_calls, self.tool_errors, self.tool_exceptions


log = logging.getLogger(__name__)
_ASYNC_METHODS = ("start", "step", "reward", "close", "compact")


def _in_thread(fn: Any) -> Any:
    """An env method written as a plain `def`: awaited like the async one, run in a thread."""

    @functools.wraps(fn)
    async def run(self: Env, *args: Any) -> Any:
        return await asyncio.to_thread(fn, self, *args)

    return run


def _check_tool_names(tools: list[Tool], env: str) -> None:
    """Each tool's name once: two of one name (an MCP server's `submit` beside SubmitTool) had
    both schemas rendered and every call run on the last one (a red-team pass)."""
    if twice := sorted(name for name, n in Counter(t.name for t in tools).items() if n > 1):
        raise TypeError(
            f"{env}.tools has more than one tool named {', '.join(map(repr, twice))}: the model "
            "would see each and every call would run the last; rename one (an MCP server's "
            "tools: McpServer(prefix=...))"
        )


class Env:
    """Base class: subclass it, or `ToolEnv` for the common chat-with-tools case."""

    tools: ClassVar[list[Tool]] = []
    max_turns: Annotated[int, Field(ge=1)] = 8
    # consecutive turns with only malformed calls → stop `parse_error`
    max_parse_errors: Annotated[int, Field(ge=1)] = 2
    # consecutive turns whose every call failed → stop `tool_error`
    max_tool_errors: Annotated[int, Field(ge=1)] = 4

    def __init_subclass__(cls, **kw: Any) -> None:
        super().__init_subclass__(**kw)
        for name in _ASYNC_METHODS:
            fn = cls.__dict__.get(name)
            if callable(fn) and not inspect.iscoroutinefunction(fn):
                setattr(cls, name, _in_thread(fn))
        if isinstance(cls.__dict__.get("tools"), list):
            _check_tool_names(cls.tools, cls.__name__)

    def __init__(self, task: Task, ctx: ToolContext | None = None, **kwargs: Any) -> None:
        self.task = task
        self.ctx = ctx or ToolContext(session=task.id, task=task)
        for k, v in kwargs.items():
            if not hasattr(type(self), k):
                raise TypeError(f"{type(self).__name__} has no setting {k!r}")
            setattr(self, k, v)
        if "tools" in kwargs:
            _check_tool_names(self.tools, type(self).__name__)
        self._parse_error_streak = 0
        self._tool_error_streak = 0

    # -- data --------------------------------------------------------------------------------

    @classmethod
    def load_tasks(cls, path: str | None = None, limit: int | None = None, **_: Any) -> list[Task]:
        """Tasks for this env. Default: a JSONL file (UTF-8, a BOM allowed), one JSON object per
        line with an `id` field, a string or an integer (a line without one: its line's index,
        from 0); `limit`: the first N. A bad line is a ValueError naming its number."""
        if path is None:
            raise ValueError(f"{cls.__name__}.load_tasks needs env.tasks.path (a JSONL file)")
        if limit is not None and limit < 1:
            raise ValueError(f"limit={limit}: give 1 or more, or leave it out for all of {path}")
        tasks = read_tasks(Path(path), limit)  # agentrl/task_file.py: what each line may hold
        if not tasks:
            raise ValueError(f"no tasks in {path}")
        return tasks

    # -- episode -----------------------------------------------------------------------------

    async def start(self) -> list[Message]:
        raise NotImplementedError(f"{type(self).__name__} must implement async start()")

    async def step(self, turn: AssistantTurn) -> StepResult:
        """Default: run the turn's tool calls; done when the turn has none."""
        calls = turn.message.tool_calls
        if not calls and not turn.parse_errors:
            return StepResult(done=True)
        obs = [
            Message(role="tool", content=f"Error: {e.message}", name=e.name)
            for e in turn.parse_errors
        ]
        results = await gather_all(self.call_tool(c) for c in calls)
        # bad arguments or an unknown tool, refused before a call: the model's errors
        outcomes = [
            ToolOutcome.failed(self._known(e.name), "error", f"Error: {e.message}")
            for e in turn.parse_errors
            if e.is_call_error
        ]
        for call, res in zip(calls, results, strict=True):
            obs.append(
                Message(role="tool", content=res.content, tool_call_id=call.id, name=call.name)
            )
            outcomes.append(self._outcome(call.name, res))
        ok, errors, broken = tally(outcomes)  # broken: the tool's fault, not the policy's
        attempted = len(outcomes)
        self._parse_error_streak = self._parse_error_streak + 1 if not attempted else 0
        self._tool_error_streak = (
            self._tool_error_streak + 1 if attempted and errors == attempted else 0
        )
        stop = None
        ended = any(r.ends_episode and not r.is_error for r in results)  # a `submit`
        if self._parse_error_streak >= self.max_parse_errors:
            stop = StopReason.PARSE_ERROR
        elif self._tool_error_streak >= self.max_tool_errors:
            stop = StopReason.TOOL_ERROR
        return StepResult(
            messages=obs,
            done=stop is not None or ended,
            stop_reason=stop,
            tool_calls=ok,
            tool_errors=errors,
            tool_exceptions=broken,
            tool_outcomes=outcomes,
            tool_latency_s=max((r.latency_s for r in results), default=0.0),
        )

    def _known(self, name: str | None) -> str:
        """The tool's name for metrics: one of this env's, or `ToolOutcome.UNKNOWN`."""
        return name if name in self.tool_map else ToolOutcome.UNKNOWN

    def _outcome(self, name: str, res: ToolResult) -> ToolOutcome:
        if res.is_tool_fault:
            return ToolOutcome.failed(self._known(name), "exception", res.content)
        if res.is_error:  # the sandbox tools say which limit ended the code (tools/python.py)
            tampered = res.metadata.get("limit") == "control_channel"
            return ToolOutcome.failed(self._known(name), "error", res.content, tampered)
        return ToolOutcome(self._known(name))

    async def call_tool(self, call: ToolCall) -> ToolResult:
        tool = self.tool_map.get(call.name)
        if tool is None:
            return ToolResult(
                content=f"Error: unknown tool '{call.name}'; available: {sorted(self.tool_map)}",
                is_error=True,
            )
        return await tool.invoke(call.arguments, self.ctx)

    async def reward(self, trajectory: Trajectory) -> float | dict[str, float]:
        raise NotImplementedError(f"{type(self).__name__} must implement async reward()")

    async def compact(self, messages: list[Message]) -> list[Message] | None:
        """rollout.context.policy=env: the history the episode goes on from once its context
        fills up (e.g. system + task + a summary + the last turns), or None for no rewrite (the
        episode then overflows as without a policy). The episode continues in a new training
        segment over the template's rendering of what this returns (agentrl/context.py)."""
        return None

    async def close(self) -> None:
        for tool in self.tools:  # what a tool holds for this episode (an MCP server, …)
            try:
                await tool.end_episode(self.ctx)
            except Exception:  # one tool's clean-up never skips the others' or the sandbox's
                log.exception("%s.end_episode failed", type(tool).__name__)
        if self.ctx.sandbox is not None:
            await self.ctx.sandbox.close_session(self.ctx.session)

    # -- helpers -----------------------------------------------------------------------------

    @property
    def tool_map(self) -> dict[str, Tool]:
        return {t.name: t for t in self.tools}

    def tool_schemas(self) -> list[dict[str, Any]]:
        return [t.schema() for t in self.tools]

    @staticmethod
    def final_text(trajectory: Trajectory) -> str:
        """Content of the last assistant message ('' if none)."""
        for m in reversed(trajectory.messages):
            if m.role == "assistant":
                return m.content
        return ""


class ToolEnv(Env):
    """Chat with tools: `system_prompt` + the task's `prompt` field as the user message."""

    system_prompt: str | None = None

    async def start(self) -> list[Message]:
        msgs = []
        if self.system_prompt:
            msgs.append(Message(role="system", content=self.system_prompt))
        msgs.append(Message(role="user", content=str(self.task.data["prompt"])))
        return msgs


def read_reward(value: Any) -> tuple[float, dict[str, float]]:
    """What `Env.reward` returned → (the reward, its components): a number, or a dict with
    `total`; a reward that is not a finite number raises (one NaN would poison its group), and so
    does a component that is not (its NaN went to reward/<key> in the metrics without a word)."""
    components: dict[str, float] = {}
    if isinstance(value, dict):
        if "total" not in value:
            raise ValueError(f"reward dict needs a 'total' key (the reward trained on), got "
                             f"{sorted(value)}: e.g. {{'total': correct, 'correct': correct}}")  # fmt: skip
        components = {k: _number(v, f"reward[{k!r}]") for k, v in value.items()}
        for k, v in components.items():
            if k != "total" and not math.isfinite(v):  # the total: bounded_reward below
                raise ValueError(f"reward[{k!r}] is {v}; reward components must be finite numbers")
        value = value["total"]
    return bounded_reward(_number(value, "reward")), components


def _number(value: Any, what: str) -> float:
    """float(value), but text is refused: float() reads '1_000', ' 1e6 ' and '١', so a reward
    passed on as text (a judge's reply, the model's own words) would be the policy's to set."""
    if fix := unawaited(value):
        raise TypeError(f"{what} is {fix}, not a number")
    if isinstance(value, str | bytes | bytearray):
        raise TypeError(f"{what} is text ({value!r:.40}), not a number: parse and check it in "
                        "reward(), then return a float")  # fmt: skip
    try:
        return float(value)
    except TypeError:  # None (a reward() that forgot its return), a list, an object
        raise TypeError(f"{what} is {type(value).__name__} ({value!r:.40}), not a number: return "
                        "a float, or a dict of floats with a 'total'") from None  # fmt: skip


REWARD_BOUND = 1e6  # beyond it a group's statistics overflow float32 (advantages 0, inf or NaN)


def bounded_reward(reward: float) -> float:
    """A finite reward, clipped to ±REWARD_BOUND (warned once): a red-team policy answered 1e200
    to an env scoring -|answer - target|, and its group's advantages came out all 0 (grpo), inf
    (drgrpo) or NaN, skipping every group's update. A non-finite one raises."""
    if not math.isfinite(reward):
        raise ValueError(f"reward is {reward}; rewards must be finite numbers")
    if abs(reward) <= REWARD_BOUND:
        return reward
    if not _CLIPPED:
        _CLIPPED.append(reward)
        log.warning("a reward of %g was clipped to ±%g (REWARD_BOUND); scale the env's rewards",
                    reward, REWARD_BOUND)  # fmt: skip
    return math.copysign(REWARD_BOUND, reward)


_CLIPPED: list[float] = []


def checked_messages(value: Any, what: str) -> list[Message]:
    """`value` as a list of `Message`, or a TypeError naming `what` and the fix (`start` returning
    the prompt's text, a step's observation as a dict)."""
    if isinstance(value, list | tuple):
        wrong = [m for m in value if not isinstance(m, Message)]
        if not wrong:
            return list(value)
        got = f"a {type(wrong[0]).__name__} in its list ({wrong[0]!r:.60})"
    elif fix := unawaited(value):
        raise TypeError(f"{what}: got {fix}")
    else:
        got = f"{type(value).__name__} ({value!r:.60})"
    raise TypeError(
        f"{what}: got {got}; give a list of Message, e.g. "
        '[Message(role="user", content=...)] (from agentrl.types import Message)'
    )


async def take_step(env: Env, said: AssistantTurn, turn: Turn) -> StepResult | StopReason:
    """`env.step(said)`, its tool counts and per-turn reward recorded on `turn`. The env raising
    on the policy's turn is `EnvStepError` (`env_error`: scored 0, in its group; the sandbox's
    outages and configuration errors go on up); a per-turn reward that is not a finite number
    (text included) ends the episode as `reward_error` (a NaN made its whole group NaN: a
    red-team pass)."""
    try:
        result = await env.step(said)
        if fix := unawaited(result):
            raise TypeError(f"{type(env).__name__}.step() returned {fix}")
        if not isinstance(result, StepResult):
            raise TypeError(
                f"{type(env).__name__}.step() returned {type(result).__name__} ({result!r:.60}): "
                "return a StepResult(messages=[...], done=...) (from agentrl.env import StepResult)"
            )
        checked_messages(result.messages, f"{type(env).__name__}.step()'s StepResult.messages")
    except (SandboxUnavailable, ConfigError, RenderError):  # infrastructure, configuration
        raise
    except Exception as e:  # the policy's text can make an env's step raise: not a hiding place
        raise EnvStepError(traceback.format_exc()) from e
    turn.num_tool_calls, turn.num_tool_errors, turn.num_tool_exceptions = result.tool_counts()
    turn.tool_outcomes = list(result.tool_outcomes)
    turn.tool_latency_s = result.tool_latency_s
    try:
        reward = None if result.reward is None else _number(result.reward, "StepResult.reward")
        turn.reward = None if reward is None else bounded_reward(reward)
    except (TypeError, ValueError):  # text ('0.3' escaped as an abort), NaN, inf
        turn.reward = 0.0
        return StopReason.REWARD_ERROR
    return result


async def finish_episode(env: Env, traj: Trajectory) -> None:
    """Score `traj` with `env.reward` (not an infrastructure failure, nor an episode whose turn
    reward already failed), then close the env. A reward that raises scores 0 and the episode
    stays in its group as `reward_error`, but a truncated one keeps its stop reason: its penalty
    or mask must hold (a reward that raised on a cut answer escaped both: a red-team pass). A
    reward whose sandbox is unavailable (a grading call that found the service down) ends the
    episode as `sandbox_unavailable`, as a tool call's does: out of the batch and its group's
    baseline, its group rolled out again; as `reward_error` it taught the policy that a right
    answer scored 0."""
    failed = traj.stop_reason in (StopReason.REWARD_ERROR, StopReason.ENV_ERROR)  # scored 0
    if traj.stop_reason is StopReason.REWARD_ERROR:  # by the rollout: a turn's reward
        traj.error = traj.error or "a turn's reward (StepResult.reward) was not a finite number"
    try:
        if not traj.stop_reason.is_infra_failure and not failed:
            traj.reward, traj.reward_components = read_reward(await env.reward(traj))
    except SandboxUnavailable as e:  # the grader's sandbox is down: no score, not a 0
        traj.reward, traj.stop_reason = 0.0, StopReason.SANDBOX_UNAVAILABLE
        traj.error = f"reward: {type(e).__name__}: {e}"
    except Exception as e:  # the env's scorer failed on this trajectory: scored 0, visible
        warn_episode(log, traj.metadata["session"], f"reward failed: {type(e).__name__}: {e}")
        traj.reward = 0.0
        if traj.stop_reason not in TRUNCATED_STOPS:
            traj.stop_reason = StopReason.REWARD_ERROR
        traj.error = f"reward: {traceback.format_exc()}"
    try:
        await env.close()
    except Exception as e:  # noqa: BLE001 - the episode is over either way
        log.warning("env.close of %s failed: %s", traj.metadata["session"], e)
