"""rollout.context in the rollout's episode loop (agentrl/context.py says what each policy does):
the history a policy makes of an episode's messages, with its ids, and the start-up check that
the chat template can render the history a summary leaves.

Whose fault is what (agentrl/types.py, StopReason): `env.compact` is the env's code run on the
policy's history, as `env.step` is, so its raising, a return that is not a list of Message, and a
history the chat template refuses are the env's `env_error` (scored, in its group), never an
infrastructure `aborted` (out of the baseline) nor the model's `parse_error`. A template that
refuses the summary's history shape (two user messages in a row) is a configuration error found
at start-up, before any episode blames the model for it.
"""

from __future__ import annotations

import logging
import traceback

from agentrl.context import ContextConfig, summarized, trim_tool_outputs
from agentrl.env import Env, checked_messages
from agentrl.render import Renderer, RenderError
from agentrl.sandbox.base import SandboxUnavailable
from agentrl.types import ConfigError, EnvStepError, Message

log = logging.getLogger(__name__)
_STILL_FULL: set[str] = set()  # the policies warned of leaving a history past compact_at


async def rewritten(
    c: ContextConfig, env: Env, messages: list[Message], renderer: Renderer, current: int
) -> tuple[list[Message], list[int]] | None:
    """(the history, its prompt ids) that rollout.context.policy trim_tool_outputs or env makes
    of `messages`, or None: no rewrite. A trim whose prompt is not shorter than the `current`
    one's ids is no rewrite (it would fork a sequence over a history no smaller)."""
    if c.policy == "trim_tool_outputs":
        count = renderer.encode_text
        out = trim_tool_outputs(messages, c.keep_turns, lambda t: len(count(t)))
        if out is None:
            return None
        ids = renderer.history_ids(out)  # Unrenderable: the model's turn (the shape is kept)
        return (out, ids) if len(ids) < current else None
    return await env_history(env, messages, renderer)


async def env_history(
    env: Env, messages: list[Message], renderer: Renderer
) -> tuple[list[Message], list[int]] | None:
    """`env.compact(messages)` and its prompt ids, or None (no rewrite); the env failing at it
    is `EnvStepError` (env_error), the sandbox's outages and configuration errors go on up."""
    what = f"{type(env).__name__}.compact"
    try:
        out = await env.compact(list(messages))
        if out is None:
            return None
        out = checked_messages(out, f"{what}() (or None for no rewrite)")
        if not out:
            raise ValueError(f"{what}() returned no messages: return None for no rewrite")
    except (SandboxUnavailable, ConfigError, RenderError):
        raise
    except Exception as e:  # the policy's text can make an env's compact raise: its env_error
        raise EnvStepError(traceback.format_exc()) from e
    try:
        return out, renderer.history_ids(out)
    except Exception as e:  # Unrenderable: the env's history, not a turn of the model's
        raise EnvStepError(
            f"{what}() returned a history the chat template refuses ({e}); return one the "
            "template renders (e.g. keep the task's user message first)"
        ) from e


def check_summary_history(renderer: Renderer, c: ContextConfig) -> None:
    """rollout.context.policy=summarize: a ConfigError, at start-up, when the chat template
    refuses the history a summary leaves (the task, then the summary as a user message)."""
    if c.policy != "summarize":
        return
    probe = [Message(role="user", content="task"), Message(role="assistant", content="done")]
    try:
        renderer.prompt_ids(summarized(probe, "what was done", 0, head=1))
    except Exception as e:  # jinja2's raise_exception, RenderError, TypeError, …
        raise ConfigError(
            "rollout.context.policy=summarize: the chat template refuses the history a summary "
            f"leaves (the task's user message, then the summary as a user message): {e}. Use "
            "rollout.context.policy=trim_tool_outputs, or policy=env with an Env.compact that "
            "writes the summary where the template takes it"
        ) from e


def still_full(c: ContextConfig, after: int, full: float) -> None:
    """Warn once per policy when a rewrite leaves the prompt past compact_at (`full` ids): the
    next turn rewrites again (summarize: asks again, with less room each time, until the episode
    overflows), which only rollout/rewrites and stop/context_overflow showed before."""
    if after <= full or c.policy in _STILL_FULL:
        return
    _STILL_FULL.add(c.policy)
    log.warning(
        "rollout.context.policy=%s rewrote a history to %d ids, still past rollout.context."
        "compact_at (%d ids): the next turn rewrites again, and the episode may overflow anyway. "
        "Keep fewer turns (rollout.context.keep_turns=%d now), raise compact_at, or shorten the "
        "tool outputs (rollout.max_obs_tokens) (warned once)",
        c.policy, after, int(full), c.keep_turns,
    )  # fmt: skip
