"""OpenAI's chat-completions wire format: requests in (messages, tools, sampling), answers out
(a chat.completion, or its chat.completion.chunk stream), errors as OpenAI error bodies.

Nothing here samples or tokenizes; a request that cannot be read is a `WireError` carrying the
HTTP status and OpenAI error code the agent's SDK raises with."""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from agentrl.gateway.errors import WireError, bad
from agentrl.gateway.sampling import Knobs, read_knobs
from agentrl.types import FinishReason, Message, ToolCall

__all__ = ["ChatRequest", "WireError", "bad", "parse_request"]  # WireError, bad: errors.py


@dataclass
class ChatRequest:
    messages: list[Message]
    tools: list[dict[str, Any]]
    model: str = "agentrl"
    n: int = 1
    max_tokens: int | None = None
    stop: list[str] = field(default_factory=list)
    stream: bool = False
    include_usage: bool = False
    sampling: Knobs = field(default_factory=Knobs)  # agentrl/gateway/sampling.py
    # tool_choice none: the tools stay in the prompt (as OpenAI's model reads them, and the
    # episode's sequence goes on), a call the model writes anyway is answered as text
    no_calls: bool = False
    # reasoning_effort, chat_template_kwargs: the template's variables the request asked for;
    # the gateway renders with the run's (rollout.template_kwargs), so they must be those
    template: dict[str, Any] = field(default_factory=dict)
    # parallel_tool_calls false: at most one tool call an answer, the turn's ids cut after the
    # first (agentrl/gateway/stop.py: cut_to_one_call), so what is trained is what is answered
    parallel_calls: bool = True


ROLES = {
    "system": "system",
    "developer": "system",
    "user": "user",
    "assistant": "assistant",
    "tool": "tool",
}
MAX_N = 16
UNSUPPORTED = {  # field: why it is refused, and the values that ask for nothing (accepted)
    "response_format": ("structured outputs (response_format) are not supported: the model "
                        "samples free text, parsed for tool calls", ({"type": "text"},)),
    "logit_bias": ("logit_bias would sample from a distribution the learner never sees", ({},)),
    "functions": ("the legacy `functions` field is not supported; send `tools`", ([],)),
    "function_call": ("the legacy `function_call` field is not supported; send `tool_choice`",
                      ("auto",)),
    "modalities": ("only text is answered (`modalities` [\"text\"]): no audio output",
                   (["text"],)),
    "audio": ("audio output is not supported: the answer is text", ()),
    "web_search_options": ("web search is not supported: give the agent a search tool", ()),
}  # fmt: skip
NO_LOGPROBS = ("logprobs are not returned to agents (answering null would be a silent wrong "
               "answer); the sampled tokens' logprobs are recorded in the trajectory")  # fmt: skip


def parse_request(body: Any) -> ChatRequest:
    """A chat-completions request body → ChatRequest; anything unreadable is a 400 that says
    which field and why. Sampling settings: agentrl/gateway/sampling.py; `reasoning_effort` and
    `chat_template_kwargs` must be the run's (`template_of`). Accepted and ignored on purpose,
    as they change nothing the model reads or samples: user, metadata, store, service_tier,
    safety_identifier, prompt_cache_key, prediction (a latency hint: OpenAI's answer is the
    same without it). `parallel_tool_calls: false` answers one tool call at most (the turn
    ends after the first: `ChatRequest.parallel_calls`)."""
    if not isinstance(body, dict):
        raise bad("the request body must be a JSON object")
    for key, (why, nothing) in UNSUPPORTED.items():
        if body.get(key) is not None and body[key] not in nothing:
            raise bad(why, "unsupported_parameter", key)
    if body.get("logprobs") or body.get("top_logprobs"):
        raise bad(NO_LOGPROBS, "unsupported_parameter")
    raw = body.get("messages")
    if not isinstance(raw, list) or not raw:
        raise bad("`messages` must be a non-empty list")
    tools = _tools(body.get("tools"))
    choice = body.get("tool_choice")
    if choice not in (None, "auto", "none"):
        raise bad(
            f"tool_choice={json.dumps(choice)} is not supported (only auto and none): the "
            "gateway cannot force a call without changing what the model samples",
            "unsupported_parameter",
        )
    messages = _messages(raw)
    if messages[-1].role == "assistant":
        raise bad("the last message is an assistant message: prefilling is not supported")
    n = _int(body, "n", 1)
    if n > MAX_N:
        raise bad(f"`n` is {n}; at most {MAX_N} samples per request (each is a training sequence)")
    # a null is the field left out (SDKs that send every field): max_tokens stays in force
    key = "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
    max_tokens = None if body.get(key) is None else _int(body, key, 1)
    stop = body.get("stop") or []
    if isinstance(stop, str):
        stop = [stop]
    if not (isinstance(stop, list) and len(stop) <= 4
            and all(isinstance(s, str) and 0 < len(s) <= 256 for s in stop)):  # fmt: skip
        raise bad("`stop` must be a string or a list of at most 4 non-empty strings (256 chars)")
    stream = flag_of(body, "stream", False)
    options = body.get("stream_options") or {}
    return ChatRequest(
        messages=messages,
        tools=tools,
        model=str(body.get("model") or "agentrl"),
        n=n,
        max_tokens=max_tokens,
        stop=stop,
        stream=stream,
        include_usage=bool(isinstance(options, dict) and options.get("include_usage")),
        sampling=read_knobs(body),
        no_calls=choice == "none",
        template=template_of(body.get("chat_template_kwargs"), body.get("reasoning_effort")),
        parallel_calls=flag_of(body, "parallel_tool_calls", True),
    )


def flag_of(body: dict[str, Any], key: str, default: bool) -> bool:
    """A true/false field (null: left out): "false" as text is truthy, and would stream."""
    v = body.get(key)
    if v is None:
        return default
    if not isinstance(v, bool):
        raise bad(f"`{key}` must be true or false, got {json.dumps(v)}", param=key)
    return v


def template_of(kwargs: Any, effort: Any) -> dict[str, Any]:
    """The chat-template variables a request asks for: the vLLM/SGLang `chat_template_kwargs`
    and OpenAI's reasoning effort (the `reasoning_effort` variable of templates that read it)."""
    if kwargs is not None and not isinstance(kwargs, dict):
        raise bad("`chat_template_kwargs` must be an object", param="chat_template_kwargs")
    out = dict(kwargs or {})
    if effort is not None:
        out["reasoning_effort"] = effort
    return out


def _int(body: dict[str, Any], key: str, low: int) -> int:
    v = body.get(key, low)
    if isinstance(v, bool) or not isinstance(v, int) or v < low:
        raise bad(f"`{key}` must be an integer >= {low}, got {json.dumps(v)}")
    return v


def _tools(raw: Any) -> list[dict[str, Any]]:
    if raw is None:
        return []
    if not isinstance(raw, list):
        raise bad("`tools` must be a list")
    out = []
    for i, t in enumerate(raw):
        fn = t.get("function") if isinstance(t, dict) else None
        if not (
            isinstance(t, dict)
            and t.get("type", "function") == "function"
            and isinstance(fn, dict)
            and isinstance(fn.get("name"), str)
            and fn["name"]
        ):
            raise bad(f"tools[{i}] must be {{'type': 'function', 'function': {{'name': …}}}}")
        out.append(function_tool(fn["name"], fn.get("description"), fn.get("parameters"),
                                 f"tools[{i}]"))  # fmt: skip
    return out


def text_of(content: Any, where: str) -> str:
    """A message's content as text: a string, null, or a list of text parts."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for p in content:
            if isinstance(p, dict) and p.get("type") in ("text", "input_text", "output_text"):
                if not isinstance(p.get("text", ""), str):  # was rendered as Python's repr
                    raise bad(f"{where}: a text part's `text` must be a string")
                parts.append(p.get("text", ""))
            else:
                kind = p.get("type") if isinstance(p, dict) else type(p).__name__
                raise bad(f"{where}: content part of type {kind!r} is not supported (text only)")
        return "".join(parts)
    raise bad(f"{where}: content must be a string, null or a list of text parts")


def _messages(raw: list[Any]) -> list[Message]:
    out: list[Message] = []
    names: dict[str, str] = {}  # tool call id -> tool name, to name the tool messages
    for i, m in enumerate(raw):
        where = f"messages[{i}]"
        if not isinstance(m, dict) or not isinstance(m.get("role"), str) or m["role"] not in ROLES:
            raise bad(f"{where}: role must be one of {sorted(ROLES)}")  # a list was a 500
        role = ROLES[m["role"]]
        content = text_of(m.get("content"), where)
        try:
            if role == "assistant":
                calls = [
                    _call(c, f"{where}.tool_calls[{k}]")
                    for k, c in enumerate(m.get("tool_calls") or [])
                ]
                names.update({c.id: c.name for c in calls})
                out.append(Message(role="assistant", content=content, tool_calls=calls))
            elif role == "tool":
                cid = m.get("tool_call_id")
                if not isinstance(cid, str):
                    raise bad(f"{where}: a tool message needs its tool_call_id")
                out.append(
                    Message(
                        role="tool",
                        content=content,
                        tool_call_id=cid,
                        name=m.get("name") or names.get(cid),
                    )
                )
            else:
                out.append(Message(role=role, content=content))
        except ValidationError as e:
            raise bad(f"{where}: {e.errors()[0]['msg']}") from e
    return out


def _call(c: Any, where: str) -> ToolCall:
    fn = c.get("function") if isinstance(c, dict) else None
    if not (
        isinstance(fn, dict) and isinstance(fn.get("name"), str) and isinstance(c.get("id"), str)
    ):
        raise bad(
            f"{where} must be {{'id': …, 'type': 'function', 'function': {{'name', 'arguments'}}}}"
        )
    return ToolCall(id=c["id"], name=fn["name"], arguments=arguments_of(fn.get("arguments"), where))


def arguments_of(raw: Any, where: str) -> dict[str, Any]:
    """A tool call's arguments: a JSON object, or its JSON text (empty: no arguments)."""
    args = raw or {}
    if isinstance(args, str):
        try:
            args = json.loads(args) if args.strip() else {}
        except json.JSONDecodeError as e:
            raise bad(f"{where}: arguments are not JSON ({e})") from e
    if not isinstance(args, dict):
        raise bad(f"{where}: arguments must be a JSON object")
    return args


def function_tool(name: str, description: Any, parameters: Any, where: str) -> dict[str, Any]:
    """A function tool as chat templates read it under `tools=`: its description text, its
    parameters a JSON schema object (anything else was rendered into the prompt as it came)."""
    if description is not None and not isinstance(description, str):
        raise bad(f"{where}: a tool's description must be a string", param="tools")
    if parameters is not None and not isinstance(parameters, dict):
        raise bad(f"{where}: a tool's parameters must be a JSON schema object", param="tools")
    spec = {
        "name": name,
        "description": description or "",
        "parameters": parameters or {"type": "object", "properties": {}},
    }
    return {"type": "function", "function": spec}


# -- answers -------------------------------------------------------------------------------------

FINISH = {FinishReason.STOP: "stop", FinishReason.LENGTH: "length", FinishReason.ABORT: "stop"}


@dataclass
class Choice:
    message: Message
    finish: str  # stop | length | tool_calls


def finish_of(message: Message, reason: FinishReason) -> str:
    if message.tool_calls and reason is not FinishReason.LENGTH:
        return "tool_calls"
    return FINISH[reason]


def message_body(message: Message) -> dict[str, Any]:
    out: dict[str, Any] = {
        "role": "assistant",
        "content": message.content if message.content or not message.tool_calls else None,
    }
    if message.reasoning_content:  # the turn's <think> block, apart (as SGLang's reasoning parser)
        out["reasoning_content"] = message.reasoning_content
    if message.tool_calls:
        out["tool_calls"] = [
            {
                "id": c.id,
                "type": "function",
                "function": {"name": c.name, "arguments": json.dumps(c.arguments)},
            }
            for c in message.tool_calls
        ]
    return out


def new_id() -> str:
    return f"chatcmpl-{uuid.uuid4().hex[:24]}"


def completion_body(
    rid: str, model: str, choices: list[Choice], usage: dict[str, int]
) -> dict[str, Any]:
    return {
        "id": rid,
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [
            {
                "index": i,
                "message": message_body(c.message),
                "finish_reason": c.finish,
                "logprobs": None,
            }
            for i, c in enumerate(choices)
        ],
        "usage": usage,
    }


def stream_chunks(
    rid: str, model: str, choices: list[Choice], usage: dict[str, int] | None
) -> list[dict[str, Any]]:
    """The answer as chat.completion.chunk objects: per choice its role, its reasoning (where the
    turn has one, as `message_body` gives it), its content, each tool call whole (id, name,
    arguments), then its finish reason; the usage chunk last when asked."""
    created = int(time.time())

    def chunk(index: int, delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        return {
            "id": rid,
            "object": "chat.completion.chunk",
            "created": created,
            "model": model,
            "choices": [
                {"index": index, "delta": delta, "finish_reason": finish, "logprobs": None}
            ],
        }

    out = []
    for i, c in enumerate(choices):
        out.append(chunk(i, {"role": "assistant", "content": ""}))
        if c.message.reasoning_content:  # as the answer has it (SGLang streams it so, apart)
            out.append(chunk(i, {"reasoning_content": c.message.reasoning_content}))
        if c.message.content:
            out.append(chunk(i, {"content": c.message.content}))
        for k, call in enumerate(message_body(c.message).get("tool_calls", [])):
            out.append(chunk(i, {"tool_calls": [{"index": k, **call}]}))
        out.append(chunk(i, {}, c.finish))
    if usage is not None:
        out.append(
            {
                "id": rid,
                "object": "chat.completion.chunk",
                "created": created,
                "model": model,
                "choices": [],
                "usage": usage,
            }
        )
    return out
