"""Long episodes at their edges (rollout.context, agentrl/context.py): an engine that aborts the
summary request, an env whose compact raises or returns a history the template refuses, tool
outputs shorter than the trim marker, an env whose start holds more than one user message, a
template that refuses the summary's history, and the metric of the tokens a rewrite dropped."""

import pytest
from transformers import AutoTokenizer

from agentrl.context import MARKER, trim_tool_outputs
from agentrl.envs.synthetic import FixedLengthEnv
from agentrl.metrics import rollout_metrics
from agentrl.rollout import Rollout, RolloutConfig
from agentrl.types import Completion, ConfigError, FinishReason, Message, StopReason, Task

TASK = Task(id="t0", data={"prompt": "find the value"})
ASKED = "Your context is nearly full"


class Long(FixedLengthEnv):
    """Six turns, each answered by a 120-word tool output: about 3x a 500-token context."""

    turns = 6
    observation_words = 120


class Engine:
    """Samples a short turn; records every prompt; `abort_summary`: the engine aborts the request
    that asks for a summary (nothing sampled), as a server that dropped it does."""

    def __init__(self, tok, abort_summary=False):
        self.tok, self.prompts, self.abort_summary = tok, [], abort_summary

    async def generate(self, input_ids, params, key=None):
        self.prompts.append(list(input_ids))
        if self.abort_summary and ASKED in self.tok.decode(input_ids[-80:]):
            return Completion([], [], FinishReason.ABORT)
        ids = self.tok.encode(f"step {len(self.prompts)}", add_special_tokens=False)
        ids.append(self.tok.eos_token_id)
        return Completion(ids, [-0.25] * len(ids), FinishReason.STOP)


async def episode(tok, env=Long, engine=None, **context):
    cfg = RolloutConfig(max_context_tokens=500, max_new_tokens=16, context=context or {})
    ro = Rollout(engine or Engine(tok), tok, env, cfg)
    return ro, await ro.run_sequences(TASK)


async def test_an_aborted_summary_request_ends_the_episode_aborted(qwen_tokenizer):
    """Before: the empty answer of an aborted request became the episode's "summary", the
    history was rewritten from it and the episode went on (and trained) as if the model wrote
    it; an aborted turn ends its episode as `aborted` (infrastructure) everywhere else."""
    engine = Engine(qwen_tokenizer, abort_summary=True)
    _, segs = await episode(qwen_tokenizer, Long, engine, policy="summarize", compact_at=0.5)
    assert len(segs) == 1 and segs[0].stop_reason is StopReason.ABORTED
    segs[0].check()


class RaisingCompact(Long):
    async def compact(self, messages):
        raise ValueError("cannot summarise this")


class NoUserCompact(Long):
    """Keeps only the last turn: no user message left, which the template below refuses."""

    async def compact(self, messages):
        return messages[-2:]


def _refusing(tok_dir, guard):
    """A fresh tokenizer (the shared one stays as it is) whose template runs `guard` first."""
    tok = AutoTokenizer.from_pretrained(tok_dir)
    tok.chat_template = guard + tok.chat_template
    return tok


NO_USER = ("{%- if messages | selectattr('role', 'equalto', 'user') | list | length == 0 %}"
           "{{ raise_exception('No user query found in messages.') }}{%- endif %}")  # fmt: skip


async def test_the_envs_compact_failing_is_its_env_error(qwen_tokenizer, qwen_tokenizer_dir):
    """`env.compact` is the env's code run on the policy's history: raising there is the env's
    `env_error` (scored, in the baseline) as in `step`, not an infrastructure `aborted` (out of
    the baseline: a hiding place); a history the template refuses is the env's too, not the
    model's parse error."""
    _, segs = await episode(qwen_tokenizer, RaisingCompact, policy="env")
    assert segs[-1].stop_reason is StopReason.ENV_ERROR and "cannot summarise" in segs[-1].error
    tok = _refusing(qwen_tokenizer_dir, NO_USER)
    _, segs = await episode(tok, NoUserCompact, policy="env")
    assert segs[-1].stop_reason is StopReason.ENV_ERROR, segs[-1].stop_reason
    assert "NoUserCompact.compact" in segs[-1].error and "No user query" in segs[-1].error


def test_a_tool_output_shorter_than_the_marker_is_kept():
    msgs = [Message(role="user", content="task")]
    for out in ("ok", "x " * 50, "done"):
        msgs += [Message(role="assistant", content="call"), Message(role="tool", content=out)]
    words = len  # a token a character: the marker is about 45
    trimmed = trim_tool_outputs(msgs, 1, words)
    assert [m.content for m in trimmed if m.role == "tool"] == [
        "ok", MARKER.format(n=100), "done"]  # fmt: skip
    assert trim_tool_outputs(msgs[:-2], 0, words)[2].content == "ok"


class ShortOutputs(FixedLengthEnv):
    """A long task, then six turns each answered "ok": trimming can only make it longer."""

    turns = 6

    async def start(self):
        return [Message(role="user", content="alpha " * 280)]


async def test_trimming_never_makes_the_context_longer(qwen_tokenizer):
    """Before: the "ok"s older than the last turn became the longer marker, and the episode
    forked a new sequence over a longer history (379 -> 419 ids), counted as a rewrite."""
    _, segs = await episode(qwen_tokenizer, ShortOutputs, policy="trim_tool_outputs")
    assert all(m.content == "ok" for s in segs for m in s.messages if m.role == "tool")
    assert len(segs) == 1 and segs[0].stop_reason is StopReason.COMPLETED


class FewShot(Long):
    """A start of several user messages: an example exchange, then the task."""

    async def start(self):
        return [Message(role="system", content="You solve tasks."),
                Message(role="user", content="Example: what is 2+2?"),
                Message(role="assistant", content="4"),
                Message(role="user", content="The task: find the value")]  # fmt: skip


async def test_a_summary_keeps_every_message_the_env_started_with(qwen_tokenizer):
    """Before: the history after a summary kept the messages up to the first user message only,
    so an env that starts with an example exchange lost its task (and its example answer)."""
    _, segs = await episode(qwen_tokenizer, FewShot, policy="summarize", compact_at=0.5)
    assert len(segs) > 1
    start = [m.content for m in segs[0].messages[:4]]
    for s in segs[1:]:
        assert [m.content for m in s.messages[:4]] == start
        assert s.messages[4].content.startswith("Summary of your work so far:")


ALTERNATE = ("{%- for m in messages[1:] %}{%- if m.role == 'user' and messages[loop.index0].role"
             " == 'user' %}{{ raise_exception('Conversation roles must alternate') }}"
             "{%- endif %}{%- endfor %}")  # fmt: skip


def test_a_template_that_refuses_the_summary_history_fails_at_start(qwen_tokenizer_dir):
    """Before: every episode that reached compact_at ended `parse_error` (the model's fault) on
    a template that refuses two user messages in a row (the task, then the summary)."""
    tok = _refusing(qwen_tokenizer_dir, ALTERNATE)
    cfg = RolloutConfig(max_context_tokens=500, context={"policy": "summarize"})
    with pytest.raises(ConfigError, match="rollout.context.policy=summarize"):
        Rollout(Engine(tok), tok, Long, cfg)
    Rollout(Engine(tok), tok, Long, RolloutConfig(context={"policy": "trim_tool_outputs"}))


async def test_the_metrics_say_how_many_tokens_the_rewrites_dropped(qwen_tokenizer):
    _, segs = await episode(qwen_tokenizer, Long, policy="trim_tool_outputs")
    m = rollout_metrics(segs)
    dropped = sum(b - a for b, a in (s.metadata["rewrite"] for s in segs[1:]))
    assert dropped > 0 and m["rollout/rewrite_tokens_dropped"] == dropped


async def test_a_rewrite_that_leaves_the_history_past_compact_at_is_said(qwen_tokenizer, caplog):
    """Keeping the last turn whole with its 120-word result leaves the summarised history past
    compact_at: each next turn asks again with less room, until the episode overflows. Before,
    only the counts said so (rollout/rewrites, stop/context_overflow); now a warning says why."""
    from agentrl import rollout_context

    rollout_context._STILL_FULL.clear()
    with caplog.at_level("WARNING", logger="agentrl.rollout_context"):
        await episode(qwen_tokenizer, Long, policy="summarize", compact_at=0.25)
    assert "still past rollout.context.compact_at" in caplog.text
    assert "rollout.context.keep_turns=1" in caplog.text
