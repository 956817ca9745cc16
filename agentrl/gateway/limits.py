"""How big a request may be before the gateway does work on it that grows with it: each bound
refuses, as the episode's context_overflow, a request no history of rollout.max_context_tokens
tokens could be, before the work it would cost in the event loop every episode shares.

    body_limit    bytes: past it the body is not read (aiohttp's client_max_size)
    parts_past    messages, tool calls and tools: past the context's tokens, nothing is parsed
                  or rendered (a chat template writes at least one token for each)
    tokens_past   text: counted a chunk at a time, and refused once past the context
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from agentrl.render import Renderer
from agentrl.types import Message

# A request's body, in bytes per token of rollout.max_context_tokens, past which it cannot be a
# history that fits: a token is 3-5 bytes of JSON-escaped text, 12 of escaped CJK or emoji.
# Larger bodies are refused before they are read, let alone tokenized: a red-team agent's 7.5 MB
# message was refused only after 33 s of tokenizing, in the event loop every episode shares.
BODY_BYTES_PER_TOKEN = 64
BODY_MIN_BYTES = 1 << 20


def body_limit(max_context_tokens: int) -> int:
    """The largest request body the gateway reads (aiohttp's client_max_size)."""
    return max(BODY_MIN_BYTES, BODY_BYTES_PER_TOKEN * max_context_tokens)


# Under `body_limit`, a body of tiny parts is still many: 1.6 MB of `{"role":"user"}` is 100k
# messages, parsed and rendered (3.2 s, the event loop every episode shares held) before the
# prompt's length refused them. Every message, tool call and tool is at least one token of
# the chat template's markup (its role tag, the call's name, the tool's schema: every family of
# agentrl/assets/families.py, tests/unit/test_gateway_limits.py), so more of them than the
# context has tokens cannot fit. Two exceptions, counted all the same: templates that join
# system messages into one (DeepSeek) or keep only the first (gpt-oss), and DeepSeek-V3's,
# which leaves `tools` out; more system messages or tools than the context has tokens is no
# request an agent makes.


@dataclass
class Parts:
    """What a request holds that the template writes at least one token for: `cut`, counting
    stopped once past the limit (there are more)."""

    messages: int = 0
    calls: int = 0
    tools: int = 0
    cut: bool = False

    @property
    def total(self) -> int:
        return self.messages + self.calls + self.tools

    def why(self, limit: int) -> str:
        more = "+" if self.cut else ""
        return (f"the request holds {self.total}{more} messages, tool calls and tools "
                f"({self.messages} messages, {self.calls}{more} tool calls, {self.tools} tools), "
                f"more than rollout.max_context_tokens={limit}: the chat template writes at "
                "least one token for each, so they cannot fit; it was not rendered")  # fmt: skip


def _len(v: Any) -> int:
    return len(v) if isinstance(v, list) else 0


def chat_parts(body: Any, limit: int) -> Parts:
    """A chat-completions body's parts (the raw JSON; malformed ones are counted as they come
    and refused by the parser), counted until past `limit`."""
    if not isinstance(body, dict):
        return Parts()
    messages = body.get("messages")
    parts = Parts(messages=_len(messages), tools=_len(body.get("tools")))
    for m in messages if isinstance(messages, list) else []:
        if parts.total > limit:
            parts.cut = True
            break
        parts.calls += _len(m.get("tool_calls")) if isinstance(m, dict) else 0
    return parts


def responses_parts(body: Any, limit: int) -> Parts:
    """A Responses API body's parts: its instructions, message and function_call_output items
    (messages) and function_call items (calls); reasoning items are rendered as nothing."""
    if not isinstance(body, dict):
        return Parts()
    items = body.get("input")
    parts = Parts(messages=1 if body.get("instructions") else 0, tools=_len(body.get("tools")))
    if not isinstance(items, list):
        return parts
    if parts.total + len(items) <= limit:  # each item is one part at most: none past
        parts.messages += len(items)
        return parts
    for item in items:
        if parts.total > limit:
            parts.cut = True
            break
        kind = item.get("type", "message") if isinstance(item, dict) else "message"
        parts.calls += kind == "function_call"
        parts.messages += kind != "function_call" and kind != "reasoning"
    return parts


# Text past this many characters a token of rollout.max_context_tokens is counted, a chunk at a
# time, before the request is rendered: ordinary text is 3-5 characters a token and is never
# counted twice; a body under `body_limit` that still holds far more tokens than the context
# (2 MB of short tokens, 1.7M of them at 32k: 1.8 s of tokenizing in the event loop every episode
# shares) is refused once the count passes the context, after about one context's tokenizing.
COUNT_PAST_CHARS_PER_TOKEN = 8
COUNT_CHUNK_CHARS = 1 << 15


def tokens_past(
    renderer: Renderer,
    messages: list[Message],
    limit: int,
    tools: list[dict[str, Any]] | None = None,
) -> int | None:
    """The tokens counted in the messages' and the tools' text once past `limit` (chunk by
    chunk, stopping there), or None: within the limit, or too short to need counting. Tokenizing
    pieces never gives fewer tokens than the whole by more than one a cut, and the cuts are
    allowed for. The tools are counted before a renderer is made for them (which renders them)."""
    texts = [t for m in messages for t in (m.content, m.reasoning_content or "") if t]
    texts += [json.dumps(c.arguments, ensure_ascii=False) for m in messages for c in m.tool_calls]
    texts += [json.dumps(t, ensure_ascii=False) for t in tools or []]
    if sum(map(len, texts)) <= COUNT_PAST_CHARS_PER_TOKEN * limit:
        return None
    count = cuts = 0
    for text in texts:
        for at in range(0, len(text), COUNT_CHUNK_CHARS):
            count += len(renderer.encode_text(text[at : at + COUNT_CHUNK_CHARS]))
            cuts += 1
            if count - cuts > limit:
                return count
    return None
