"""Long episodes: what happens when an episode's context fills up (`rollout.context`).

Without a policy an episode whose next prompt does not fit `rollout.max_context_tokens` stops
with `context_overflow`, and the longest episodes are the ones never trained on. A policy
rewrites the history instead, before the prompt reaches `compact_at` of the budget:

    none               (default) no rewrite: the episode overflows as before
    trim_tool_outputs  the tool results older than the last `keep_turns` assistant turns are
                       replaced by a marker saying how many tokens were dropped (those shorter
                       than the marker stay; a trim that leaves the prompt no shorter is none)
    summarize          the model is asked for a summary (`summary_prompt`, after the turn's
                       results): its summary turn is sampled and trained in the segment that
                       asked, and the next segment is the env's start messages (the task)
                       + the summary + the last `keep_turns` turns
    env                the env's own rewrite: `Env.compact(messages)` returns the new history
                       (a summary it wrote, the turns it keeps), or None for no rewrite

A rewrite starts a new training segment (the same mechanism as rollout.thinking=template): the
episode goes on in a new sequence whose prompt is the template's rendering of the rewritten
history (mask 0), and each segment trains on the turns sampled in it — token-exact over the
prompt the model actually read. The segments share the episode's session (the group baseline
counts the episode once) and its reward; each gets the episode's advantage. Per-turn credit
(`algo.advantage.reward_level=turn`) is refused with a policy: a segment's turn indices are not
the episode's. Metrics: rollout/rewrites (per episode), rollout/rewrite_tokens_before and
rollout/rewrite_tokens_after (the prompt's ids before and after, summed),
rollout/rewrite_tokens_dropped (their difference), and stop/context_overflow still counts the
episodes a rewrite could not save. Whose fault a failing rewrite is: agentrl/rollout_context.py.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from agentrl.types import Message

MARKER = "[output removed to fit the context: {n} tokens]"


class ContextConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    policy: Literal["none", "trim_tool_outputs", "summarize", "env"] = Field(
        "none",
        description="what an episode does when its context fills up: none (stop with "
        "context_overflow), trim_tool_outputs (old tool results become a marker), summarize "
        "(the model writes a summary, sampled and trained, and the episode goes on from the "
        "task + the summary + the last keep_turns turns), env (the env's `compact(messages)` "
        "rewrites the history); a rewrite starts a new training segment (docs/rollouts.md)",
    )
    summary_prompt: str = Field(
        "Your context is nearly full. Summarize what you have done and found so far, and what "
        "is left to do, in a few sentences: the conversation goes on from your summary.",
        description="summarize: the user message that asks for the summary (an env's "
        "`summary_prompt` attribute, when it has one, takes its place)",
    )
    compact_at: float = Field(
        0.75,
        gt=0,
        le=1,
        description="rewrite once the next prompt would pass this fraction of "
        "rollout.max_context_tokens (leaving room for the next turns; summarize needs room for "
        "its question and the summary too)",
    )
    keep_turns: int = Field(
        1, ge=0, description="trim_tool_outputs: the last assistant turns whose results stay whole"
    )


def trim_tool_outputs(
    messages: list[Message], keep_turns: int, count: Callable[[str], int]
) -> list[Message] | None:
    """`messages` with the content of every tool message before the last `keep_turns` assistant
    turns replaced by the marker (`count(text)`: its tokens), where the marker is shorter (an
    "ok" stays "ok"); None when nothing is left to trim."""
    cut = _last_turns(messages, keep_turns)
    out, changed = [], False
    for i, m in enumerate(messages):
        if i < cut and m.role == "tool" and not _trimmed(m):
            n = count(m.content)
            if count(marker := MARKER.format(n=n)) < n:
                m, changed = m.model_copy(update={"content": marker}), True
        out.append(m)
    return out if changed else None


def summarized(
    messages: list[Message], summary: str, keep_turns: int, head: int | None = None
) -> list[Message]:
    """The history after a summary: the first `head` messages (the env's start: system prompt,
    task, any example exchange; None: up to the first user message), the summary as a user
    message, then the last `keep_turns` assistant turns after them with what followed them."""
    if head is None:
        head = next((i for i, m in enumerate(messages) if m.role == "user"), 0) + 1
    tail = messages[max(_last_turns(messages, keep_turns), head) :]
    note = Message(role="user", content=f"Summary of your work so far:\n{summary.strip()}")
    return [*messages[:head], note, *tail]


def _last_turns(messages: list[Message], keep_turns: int) -> int:
    """Where the last `keep_turns` assistant turns begin (all of them when there are fewer;
    the end of `messages` for 0)."""
    turns = [i for i, m in enumerate(messages) if m.role == "assistant"]
    if keep_turns == 0 or not turns:
        return len(messages)
    return turns[-min(keep_turns, len(turns))]


def _trimmed(m: Message) -> bool:
    return m.content.startswith(MARKER.split("{n}")[0])
