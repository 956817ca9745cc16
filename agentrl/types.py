"""Records that cross module borders.

Legend: T tokens (of one trajectory).

Message / ToolCall are the message layer (what users and chat templates see); Completion, Turn and
Trajectory are the token layer (what the engine sampled and the learner trains on). A Trajectory is
built only by `agentrl.rollout`; its constructor checks that ids, loss mask and logprobs line up.
"""

from __future__ import annotations

import inspect
import json
from collections import Counter
from dataclasses import asdict, dataclass, field, fields
from enum import StrEnum
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field


class ConfigError(ValueError):
    """A configuration that cannot work; the message names the setting and the fix."""


class TrainingError(RuntimeError):
    """The run cannot go on; the message says why and what to do."""


class Task(BaseModel):
    """One problem handed to an Env. `data` holds the env-specific fields (question, answer, …)."""

    model_config = ConfigDict(extra="forbid")

    id: str
    data: dict[str, Any] = Field(default_factory=dict)


class StopReason(StrEnum):
    """Why an episode ended. Counted as `stop/<reason>` in metrics.

    The first four are normal endings the policy is scored on; the rest are failures. Of those,
    `parse_error` and `tool_error` are the policy's fault (scored), and so is `timeout` (the
    episode ran past `rollout.episode_timeout_s` while most of its time went to its own tool
    calls: `StopReason.of_timeout`; a red-team policy stalled that way out of its baseline); `reward_error` (the env's
    reward raised on this trajectory) is scored 0 and stays in its group, visible, never hidden as
    infrastructure, and so is `agent_error` (an `AgentEnv`'s agent raised or its command failed:
    the policy's text can make an agent framework raise, so it must not hide there), and so is
    `env_error` (the env's `step` raised on the policy's turn, for the same reason: a red-team
    policy could steer a user env's step into raising and leave its baseline); `sandbox_unavailable` and `aborted` (the system stopped the episode, or the
    env's start raised) are infrastructure failures: excluded from the group baseline, never
    scored 0. Episodes whose env code raised (`aborted` with a traceback, `reward_error`,
    `agent_error`) count against `trainer.guards.max_aborted_frac`.

    Whose outcome is whose: the one rule (each path is tested to the advantage).

    - **The model's** (an observation it reads; scored, in the baseline): whatever its text or
      its code causes. Unparsable calls, more calls in a turn than the chat template can write
      (none of them run), a turn the template cannot render, bad arguments, unknown tools; and
      everything the code does in the sandbox: exceptions, any output (invalid UTF-8 and lone
      surrogates serialise as U+FFFD), a timeout once it runs, every limit (`ExecResult.limit`: cpu_time, memory,
      processes, output, file_size, control_channel, code_size when it is too large to run), and
      an eviction because its sandbox held the most of a service-wide cap (`limit="memory"` or
      `"processes"` with `session_reset`). Tool output and env text are text: they never become
      special tokens (agentrl/render.py), so they cannot forge turns.
    - **The tool's** (`rollout/tool_exceptions`; an error observation, never a `tool_error`
      stop): an exception in the tool's own code, a call the service refuses for the tool's own
      settings (an unknown language, a bad timeout, a wrong token: HTTP 4xx), an async tool that
      blocks the event loop past its timeout.
    - **The infrastructure's** (`sandbox_unavailable`, `aborted` without a traceback: out of the
      baseline, the group rolled out again, counted): only evidence the code cannot forge. The
      sandbox service refused the connection, answered busy after its queue wait, failed (5xx),
      or died (restarted, the group re-issued; past `trainer.guards.max_unavailable_frac` the run
      stops); an engine died or hung (restarted, re-issued). Waiting for a sandbox slot is the
      service's time, never the code's timeout (`ExecResult.queue_s`, `Tool.timeout_grace_s`).
    """

    COMPLETED = "completed"
    MAX_TURNS = "max_turns"
    LENGTH = "length"
    CONTEXT_OVERFLOW = "context_overflow"
    PARSE_ERROR = "parse_error"
    TOOL_ERROR = "tool_error"
    REWARD_ERROR = "reward_error"
    AGENT_ERROR = "agent_error"
    ENV_ERROR = "env_error"
    SANDBOX_UNAVAILABLE = "sandbox_unavailable"
    ABORTED = "aborted"
    TIMEOUT = "timeout"

    @property
    def is_infra_failure(self) -> bool:
        return self in (StopReason.SANDBOX_UNAVAILABLE, StopReason.ABORTED)

    @staticmethod
    def of_timeout(tool_s: float, elapsed_s: float) -> StopReason:
        """An episode past its time limit: the policy's (`timeout`, scored) when its finished tool
        calls (an agent's: the time outside its sampling) took half its time or more (their code
        is the policy's, and so is waiting on it), else the system's (`aborted`: a slow or stuck
        engine)."""
        return StopReason.TIMEOUT if tool_s >= 0.5 * elapsed_s else StopReason.ABORTED


def unawaited(value: Any) -> str | None:
    """The fix when `value` is a coroutine (an `async def` called without `await`: a reward that
    returns `self.grade(t)`), which is closed so Python does not warn 'never awaited' as well;
    None for anything else."""
    if not inspect.iscoroutine(value):
        return None
    value.close()
    name = getattr(value, "__qualname__", "an async function")
    return (
        f"a coroutine of {name}: an `await` is missing where {name.rsplit('.', 1)[-1]}() is called"
    )


class EnvStepError(Exception):
    """The env's `step` raised on the policy's turn (args[0]: its traceback): `env_error`."""


class PromptOverflow(Exception):
    """An episode's first prompt leaves no room for a turn (rollout.max_context_tokens, or the
    server's context length), so every episode of its task would stop there: `context_overflow`
    with no turn, this text its error (the guards warn, agentrl/guards.py: `prompt_overflows`)."""


# a token budget cut the episode: rollout.truncated decides (train, mask or penalise its reward)
TRUNCATED_STOPS = frozenset({StopReason.LENGTH, StopReason.CONTEXT_OVERFLOW})


class FinishReason(StrEnum):
    """Why the engine stopped one generation (SGLang's `meta_info.finish_reason.type`)."""

    STOP = "stop"
    LENGTH = "length"
    ABORT = "abort"


class ToolCall(BaseModel):
    """One call the model asked for, as parsed from its text."""

    model_config = ConfigDict(extra="forbid")

    id: str
    name: str
    arguments: dict[str, Any] = Field(default_factory=dict)

    def to_template(self, string_args: bool = False) -> dict[str, Any]:
        """OpenAI-style dict, the shape HF chat templates expect under `tool_calls`; arguments
        as a dict (most templates `tojson` them), or as their JSON text (`string_args`: templates
        that concatenate them as a string, DeepSeek-V3's)."""
        args: Any = (
            json.dumps(self.arguments, ensure_ascii=False) if string_args else self.arguments
        )
        return {
            "id": self.id,
            "type": "function",
            "function": {"name": self.name, "arguments": args},
        }


class Message(BaseModel):
    """One chat message. `tool` messages answer the assistant's call with id `tool_call_id`."""

    model_config = ConfigDict(extra="forbid")

    role: Literal["system", "user", "assistant", "tool"]
    content: str = ""
    tool_calls: list[ToolCall] = Field(default_factory=list)
    tool_call_id: str | None = None
    name: str | None = None
    reasoning_content: str | None = None

    def to_template(self, string_args: bool = False) -> dict[str, Any]:
        """The dict passed to `tokenizer.apply_chat_template` (`string_args`: ToolCall's)."""
        out: dict[str, Any] = {"role": self.role, "content": self.content}
        if self.tool_calls:
            out["tool_calls"] = [c.to_template(string_args) for c in self.tool_calls]
        if self.tool_call_id is not None:
            out["tool_call_id"] = self.tool_call_id
        if self.name is not None:
            out["name"] = self.name
        if self.reasoning_content is not None:  # Qwen3's and DeepSeek's key; gpt-oss reads
            out["reasoning_content"] = out["thinking"] = self.reasoning_content  # `thinking`
        return out


@dataclass
class Completion:
    """What the engine sampled for one prompt: ids, their logprobs, and why it stopped."""

    token_ids: list[int]
    logprobs: list[float]
    finish_reason: FinishReason
    weight_version: str = "0"
    prompt_tokens: int = 0
    cached_tokens: int = 0  # prompt tokens the engine's prefix (radix) cache already held
    matched_stop: int | None = None
    server: str = ""
    latency_s: float = 0.0
    # (tokens, weight_version) per stretch sampled under one version, when a weight push cut
    # the turn and it went on under new weights (agentrl/engine/gate.py); empty: all weight_version
    segments: list[tuple[int, str]] = field(default_factory=list)
    # the experts the engine routed each position of prompt + ids[:-1] to, int32 [positions,
    # MoE layers, experts per token] (learner.routing_replay; SGLang's routed_experts); else None
    routed_experts: Any = None

    def __post_init__(self) -> None:
        if len(self.token_ids) != len(self.logprobs):
            raise ValueError(
                f"Completion has {len(self.token_ids)} ids but {len(self.logprobs)} logprobs"
            )


ToolStatus = Literal["ok", "error", "exception"]


@dataclass
class ToolOutcome:
    """How one tool call went, by the tool's name: for the per-tool metrics (`tools/<name>/*`)
    and the warning about a tool that fails on most of its calls. The model read the call's
    result as a tool message; this is the framework's note of it.

    `status`: "ok"; "error" (the model's fault: bad arguments, an unknown tool, a timeout, its
    code failed); "exception" (the tool's fault: its own code raised). `message`: a failed
    call's error as the model read it, its first `MAX_CHARS` characters ("" when it worked).
    `name`: a tool the env has, or `UNKNOWN` for a name it has not (the policy's invention: one
    bucket, so made-up names cannot mint metric names). `tampered`: the call's code reached for
    what runs it and the sandbox caught it (it wrote to the sandbox's control channel: the
    result's `limit` "control_channel"); the model's error too, counted apart
    (`tools/<name>/tampered`) so that a policy learning to attack its sandbox is seen.
    """

    UNKNOWN: ClassVar[str] = "(unknown)"
    MAX_CHARS: ClassVar[int] = 300

    name: str
    status: ToolStatus = "ok"
    message: str = ""
    tampered: bool = False

    @classmethod
    def failed(
        cls, name: str, status: ToolStatus, message: str, tampered: bool = False
    ) -> ToolOutcome:
        return cls(name, status, message[: cls.MAX_CHARS], tampered)


def tally(outcomes: list[ToolOutcome]) -> tuple[int, int, int]:
    """(succeeded, the model's errors, the tool's exceptions) of these calls."""
    n = Counter(o.status for o in outcomes)
    return n["ok"], n["error"], n["exception"]


@dataclass
class Turn:
    """One assistant turn: where its sampled ids sit in the trajectory, and what came back.

    `start:end` indexes the sampled ids in `Trajectory.token_ids`; `obs_end` is where the
    observation (template delta of the tool/env messages) that followed ends (== end if none).

    The turn's tool calls, in three disjoint counts (their sum is `num_tool_attempts`), so that a
    reward paying for "used a tool" can read `num_tool_calls` and be paid only by calls that
    worked (a policy learns to make calls that fail if those pay too):

        num_tool_calls       calls that ran and succeeded
        num_tool_errors      calls that failed by the model's fault: bad arguments, an unknown
                             tool, a timeout, its code failed (`rollout/tool_errors`)
        num_tool_exceptions  calls that failed by the tool's fault: its own code raised
                             (`rollout/tool_exceptions`)

    `tool_outcomes` says the same per call, with the tool's name (`tools/<name>/*` metrics, the
    failing-tool warning); an env whose own `step` reports only counts leaves it empty.
    Malformed calls (`num_parse_errors`) are none of these: no tool was called.
    """

    start: int
    end: int
    obs_end: int
    weight_version: str
    finish_reason: FinishReason
    assistant: Message
    text: str = ""  # the decoded sampled turn, tool-call markup included (for display)
    observations: list[Message] = field(default_factory=list)
    num_tool_calls: int = 0  # succeeded (failed calls are the next two)
    num_tool_errors: int = 0  # failed: the model's fault
    num_tool_exceptions: int = 0  # failed: the tool's own code raised (not the model's call)
    tool_outcomes: list[ToolOutcome] = field(default_factory=list)  # one per call, named
    num_parse_errors: int = 0
    tool_latency_s: float = 0.0
    gen_latency_s: float = 0.0
    prompt_tokens: int = 0  # the prompt the engine read for this turn (all earlier tokens)
    cached_tokens: int = 0  # … of which its prefix cache held (not recomputed)
    truncated_obs_tokens: int = 0
    reward: float | None = None  # per-turn reward from StepResult, if the env gives one
    # async training: (tokens, weight_version) per stretch when a weight push cut this turn and
    # it went on under the new weights; `weight_version` is then the first (oldest) stretch's
    segments: list[tuple[int, str]] = field(default_factory=list)

    @property
    def num_tool_failures(self) -> int:
        """Calls that failed, whoever's fault (the model's errors and the tool's exceptions)."""
        return self.num_tool_errors + self.num_tool_exceptions

    @property
    def num_tool_attempts(self) -> int:
        """Every call the model made that named a tool, whether it worked or not."""
        return self.num_tool_calls + self.num_tool_failures

    def token_versions(self) -> list[str]:
        """The weight version of each sampled id of this turn."""
        if not self.segments:
            return [self.weight_version] * (self.end - self.start)
        return [v for n, v in self.segments for _ in range(n)]


@dataclass
class Trajectory:
    """One finished episode, token-exact.

    Worked example (ids shortened; P prompt, A sampled, O observation):

        messages: system+user  | assistant: <tool_call>…</tool_call><|im_end|> | tool: "4" | assistant: <answer>4</answer><|im_end|>
        token_ids:  P P P P P P   A A A A A                                     O O O O O   A A A A A
        loss_mask:  0 0 0 0 0 0   1 1 1 1 1                                     0 0 0 0 0   1 1 1 1 1
        logprobs:   0 0 0 0 0 0   l l l l l                                     0 0 0 0 0   l l l l l
        turns:      [Turn(start=6, end=11, obs_end=16), Turn(start=16, end=21, obs_end=21)]

    The observation ids start with the template's separator after the sampled end-of-turn token
    (e.g. "\\n") and end with the next generation prompt ("<|im_start|>assistant\\n"): everything
    the model did not sample has mask 0. `prompt_len` is the length of the first prompt.
    """

    task_id: str
    sample_index: int
    token_ids: list[int]
    loss_mask: list[int]
    logprobs: list[float]
    prompt_len: int
    turns: list[Turn]
    messages: list[Message]
    stop_reason: StopReason
    reward: float = 0.0
    reward_components: dict[str, float] = field(default_factory=dict)
    metadata: dict[str, Any] = field(default_factory=dict)
    error: str | None = None
    # learner.routing_replay: the experts the engine routed token_ids[:len(routes)] to, int32
    # [positions, MoE layers, experts per token] (the last completion's); never written to JSON
    routes: Any = None

    def __post_init__(self) -> None:
        self.check()

    def check(self) -> None:
        """Raise ValueError unless ids, mask, logprobs and turn spans line up exactly."""
        n = len(self.token_ids)
        if len(self.loss_mask) != n or len(self.logprobs) != n:
            raise ValueError(
                f"trajectory {self.task_id}/{self.sample_index}: {n} ids, "
                f"{len(self.loss_mask)} mask, {len(self.logprobs)} logprobs"
            )
        expected = [0] * n
        pos = self.prompt_len
        for t in self.turns:
            if not (t.start == pos and t.start <= t.end <= t.obs_end <= n):
                raise ValueError(f"turn spans are not contiguous at {t.start}:{t.end}:{t.obs_end}")
            if t.segments and sum(n for n, _ in t.segments) != t.end - t.start:
                raise ValueError(f"turn {t.start}:{t.end} has segments {t.segments}")
            expected[t.start : t.end] = [1] * (t.end - t.start)
            pos = t.obs_end
        if pos != n:
            raise ValueError(f"turns cover {pos} of {n} ids")
        if self.loss_mask != expected:
            raise ValueError("loss mask is not 1 exactly on sampled ids")

    @property
    def num_sampled(self) -> int:
        return sum(self.loss_mask)

    @property
    def num_tool_calls(self) -> int:
        """Tool calls that ran and succeeded, over all turns (`Turn` says what fails)."""
        return sum(t.num_tool_calls for t in self.turns)

    @property
    def num_tool_failures(self) -> int:
        """Tool calls that failed: the model's errors and the tool's exceptions."""
        return sum(t.num_tool_failures for t in self.turns)

    @property
    def num_tool_attempts(self) -> int:
        """Every tool call made, whether it worked or not."""
        return sum(t.num_tool_attempts for t in self.turns)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        del d["routes"]  # [positions, layers, k] ints: the learner's input, not a record
        d["messages"] = [m.model_dump(exclude_defaults=True) for m in self.messages]
        for turn, src in zip(d["turns"], self.turns, strict=True):
            turn["assistant"] = src.assistant.model_dump(exclude_defaults=True)
            turn["observations"] = [m.model_dump(exclude_defaults=True) for m in src.observations]
        return d

    def to_json(self) -> str:
        return json.dumps(self.to_dict())

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Trajectory:
        """The inverse of `to_dict` (keys it does not know, as trajectories.jsonl's `step`, are
        ignored). A turn written before `tool_outcomes` existed counted every attempted call in
        `num_tool_calls`; it is read as today's count of the calls that succeeded."""
        names = {f.name for f in fields(cls)}
        d = {k: v for k, v in d.items() if k in names}
        turns = []
        for t in d["turns"]:
            t = dict(t)
            t["assistant"] = Message.model_validate(t["assistant"])
            t["observations"] = [Message.model_validate(m) for m in t.get("observations", [])]
            t["finish_reason"] = FinishReason(t["finish_reason"])
            t["segments"] = [(int(n), str(v)) for n, v in t.get("segments", [])]
            if "tool_outcomes" not in t:  # an older file: its num_tool_calls were attempts
                failed = t.get("num_tool_errors", 0) + t.get("num_tool_exceptions", 0)
                t["num_tool_calls"] = max(0, t.get("num_tool_calls", 0) - failed)
            t["tool_outcomes"] = [ToolOutcome(**o) for o in t.get("tool_outcomes", [])]
            turns.append(Turn(**t))
        return cls(**{**d, "turns": turns, "stop_reason": StopReason(d["stop_reason"]),
                      "messages": [Message.model_validate(m) for m in d["messages"]]})  # fmt: skip
