"""OpenAI's Responses API (`POST /v1/responses`, the OpenAI Agents SDK's default), read into the
same ChatRequest as a chat completion and answered as a `response` object. Non-streaming and in the
foreground (`background: true` is refused); the agent sends its whole history as `input` each
time (no `previous_response_id`: the gateway keeps no conversations, it keeps training
sequences).

Input items become messages: `instructions` a system message first; message items by role
(text parts only); `function_call` items the tool calls of the assistant turn they follow;
`function_call_output` items tool messages; `reasoning` items are skipped (a reasoning item the
gateway answered, sent back as OpenAI asks, changes nothing: the turn's ids hold the reasoning as
it was sampled, and an echo is matched by its text and calls, as chat completions' echo of
`reasoning_content` is). The answer's output is a `reasoning` item first when the model reasoned
(its text as `reasoning_text` content, as chat completions' `reasoning_content`), a message item
(when the model wrote text, or called nothing) and one `function_call` item per call."""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

from agentrl.gateway.sampling import read_knobs
from agentrl.gateway.wire import (
    NO_LOGPROBS,
    ROLES,
    ChatRequest,
    Choice,
    arguments_of,
    bad,
    flag_of,
    function_tool,
    template_of,
    text_of,
)
from agentrl.types import Message, ToolCall

UNSUPPORTED = {
    "previous_response_id": "previous_response_id is not supported: send the whole history "
    "as input (the gateway keeps training sequences, not conversations)",
    "conversation": "conversations are not supported: send the whole history as input",
    "prompt": "stored prompts are not supported",
    # OpenAI queues a background response and the client polls GET /v1/responses/{id} for it.
    # Refused, not answered whole as if in the foreground (an SDK that polls reads a response
    # it cannot retrieve): the gateway stores no responses (as for previous_response_id), and
    # a sample must stay inside its request, where the episode's close cancels it, budgets
    # count it and an agent that goes away aborts it on the engine. A training agent waits for
    # its answer anyway: the next turn needs it.
    "background": "background responses are not supported: the gateway stores no responses "
    "to retrieve later (GET /v1/responses/{id}); send background: false and wait for the "
    "answer",
}


def parse_responses_request(body: Any) -> ChatRequest:
    if not isinstance(body, dict):
        raise bad("the request body must be a JSON object")
    for key, why in UNSUPPORTED.items():
        if body.get(key):
            raise bad(why, "unsupported_parameter", key)
    if body.get("stream"):
        raise bad(
            "streaming is not supported on /v1/responses: use stream=false, or chat "
            "completions (which stream)",
            "unsupported_parameter",
        )
    include = body.get("include") or []
    if not isinstance(include, list):  # a string of the logprobs' name was answered without
        raise bad("`include` must be a list", param="include")
    if body.get("top_logprobs") or "message.output_text.logprobs" in include:
        raise bad(NO_LOGPROBS, "unsupported_parameter")
    fmt = (body.get("text") or {}).get("format") if isinstance(body.get("text"), dict) else None
    if fmt not in (None, {"type": "text"}):
        raise bad(
            "structured outputs (text.format) are not supported: the model samples free "
            "text, parsed for tool calls",
            "unsupported_parameter",
        )
    choice = body.get("tool_choice")
    if choice not in (None, "auto", "none"):
        raise bad(
            f"tool_choice={json.dumps(choice)} is not supported (only auto and none)",
            "unsupported_parameter",
        )
    tools = _tools(body.get("tools"))
    reasoning = body.get("reasoning")
    effort = reasoning.get("effort") if isinstance(reasoning, dict) else None
    messages = _input(body.get("input"), body.get("instructions"))
    if messages[-1].role == "assistant":
        raise bad("the input ends with an assistant item: prefilling is not supported")
    max_tokens = body.get("max_output_tokens")
    if max_tokens is not None and (
        isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1
    ):
        raise bad(f"`max_output_tokens` must be an integer >= 1, got {json.dumps(max_tokens)}")
    return ChatRequest(
        messages=messages,
        tools=tools,
        model=str(body.get("model") or "agentrl"),
        max_tokens=max_tokens,
        sampling=read_knobs(body),
        no_calls=choice == "none",
        template=template_of(None, effort),
        parallel_calls=flag_of(body, "parallel_tool_calls", True),
    )


def _tools(raw: Any) -> list[dict[str, Any]]:
    if raw is None:
        return []
    if not isinstance(raw, list):
        raise bad("`tools` must be a list")
    out = []
    for i, t in enumerate(raw):
        if not (
            isinstance(t, dict) and t.get("type") == "function" and isinstance(t.get("name"), str)
        ):
            kind = t.get("type") if isinstance(t, dict) else type(t).__name__
            raise bad(f"tools[{i}]: only function tools are supported (got {kind!r})")
        out.append(function_tool(t["name"], t.get("description"), t.get("parameters"),
                                 f"tools[{i}]"))  # fmt: skip
    return out


def _input(raw: Any, instructions: Any) -> list[Message]:
    out: list[Message] = []
    if instructions:
        if not isinstance(instructions, str):
            raise bad("`instructions` must be a string")
        out.append(Message(role="system", content=instructions))
    if isinstance(raw, str):
        return [*out, Message(role="user", content=raw)]
    if not isinstance(raw, list) or not raw:
        raise bad("`input` must be a string or a non-empty list of items")
    names: dict[str, str] = {}
    for i, item in enumerate(raw):
        where = f"input[{i}]"
        if not isinstance(item, dict):
            raise bad(f"{where} must be an object")
        kind = item.get("type", "message")
        if kind == "message":
            role = item.get("role", "")
            role = ROLES.get(role) if isinstance(role, str) else None  # a list was a 500
            if role is None or role == "tool":
                raise bad(f"{where}: role must be user, system, developer or assistant")
            out.append(Message(role=role, content=text_of(item.get("content"), where)))
        elif kind == "function_call":
            call = _call(item, where)
            names[call.id] = call.name
            last = out[-1] if out else None
            if last is not None and last.role == "assistant" and _open(raw, i):
                last.tool_calls.append(call)
            else:
                out.append(Message(role="assistant", content="", tool_calls=[call]))
        elif kind == "function_call_output":
            cid = item.get("call_id")
            if not isinstance(cid, str):
                raise bad(f"{where}: a function_call_output needs its call_id")
            output = item.get("output")
            text = output if isinstance(output, str) else text_of(output, where)
            out.append(Message(role="tool", content=text, tool_call_id=cid, name=names.get(cid)))
        elif kind == "reasoning":
            continue
        else:
            raise bad(f"{where}: input items of type {kind!r} are not supported")
    if not out or all(m.role == "system" for m in out):
        raise bad("`input` has no message to answer")
    return out


def _open(raw: list[Any], i: int) -> bool:
    """The function_call at `i` belongs to the assistant turn just before it: the item before it
    (reasoning aside) is an assistant message or another function call of that turn."""
    for j in range(i - 1, -1, -1):  # not raw[:i]: a copy per call, quadratic in the calls
        item = raw[j]
        kind = item.get("type", "message") if isinstance(item, dict) else None
        if kind == "reasoning":
            continue
        if kind == "function_call":
            return True
        return kind == "message" and item.get("role") == "assistant"
    return False


def _call(item: dict[str, Any], where: str) -> ToolCall:
    cid, name = item.get("call_id"), item.get("name")
    if not (isinstance(cid, str) and isinstance(name, str)):
        raise bad(f"{where}: a function_call needs call_id and name")
    return ToolCall(id=cid, name=name, arguments=arguments_of(item.get("arguments"), where))


def response_body(req: ChatRequest, choice: Choice, usage: dict[str, int]) -> dict[str, Any]:
    msg = choice.message
    output: list[dict[str, Any]] = []
    if msg.reasoning_content:  # the turn's <think> block, apart (the SDK's ResponseReasoningItem)
        output.append(
            {
                "type": "reasoning",
                "id": f"rs_{uuid.uuid4().hex[:24]}",
                "summary": [],
                "content": [{"type": "reasoning_text", "text": msg.reasoning_content}],
                "status": "completed",
            }
        )
    if msg.content or not msg.tool_calls:
        output.append(
            {
                "type": "message",
                "id": f"msg_{uuid.uuid4().hex[:24]}",
                "status": "completed",
                "role": "assistant",
                "content": [{"type": "output_text", "text": msg.content, "annotations": []}],
            }
        )
    for c in msg.tool_calls:
        output.append(
            {
                "type": "function_call",
                "id": f"fc_{uuid.uuid4().hex[:24]}",
                "call_id": c.id,
                "name": c.name,
                "arguments": json.dumps(c.arguments),
                "status": "completed",
            }
        )
    incomplete = choice.finish == "length"
    return {
        "id": f"resp_{uuid.uuid4().hex[:24]}",
        "object": "response",
        "created_at": int(time.time()),
        "status": "incomplete" if incomplete else "completed",
        "incomplete_details": {"reason": "max_output_tokens"} if incomplete else None,
        "error": None,
        "model": req.model,
        "output": output,
        "parallel_tool_calls": req.parallel_calls,
        "tool_choice": "none" if req.no_calls else "auto",
        "tools": [{"type": "function", **t["function"]} for t in req.tools],
        "usage": {
            "input_tokens": usage["prompt_tokens"],
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": usage["completion_tokens"],
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": usage["total_tokens"],
        },
    }
