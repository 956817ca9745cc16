"""Tool-call parsers, by name. The key is exactly the config value (`rollout.parser`).

A parser turns the decoded text of one assistant turn into a `ParseResult`: the prose, the valid
tool calls, and typed errors for everything malformed. It never raises: any string is a valid input.

    from agentrl.parsers import get_parser
    res = get_parser("hermes").parse('<tool_call>\\n{"name": "python", "arguments": {"code": "1"}}\\n</tool_call>')
    res.tool_calls[0].name        # 'python'

`check_template(parser, tokenizer)` is the start-up check that the model's chat template renders tool
calls in a form the configured parser reads back; a mismatch is a configuration error, not a run of
silent one-turn episodes.
"""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from pydantic import BaseModel, ValidationError

from agentrl.registry import Registry, is_import_path
from agentrl.types import ConfigError, ToolCall


class ParseErrorKind(StrEnum):
    BAD_JSON = "bad_json"
    NOT_A_CALL = "not_a_call"  # JSON, but not {"name": str, "arguments": object}
    UNCLOSED_TAG = "unclosed_tag"
    TRUNCATED = "truncated"  # unclosed because the length limit cut it
    UNKNOWN_TOOL = "unknown_tool"
    INVALID_ARGS = "invalid_args"


@dataclass
class ParseError:
    kind: ParseErrorKind
    message: str  # shown to the model as an error observation
    raw: str = ""
    name: str | None = None  # the tool name, when it could be read

    @property
    def is_call_error(self) -> bool:
        """A well-formed call the tool refuses (unknown tool, bad arguments): a tool error the
        model reads, not a parse error."""
        return self.kind in (ParseErrorKind.INVALID_ARGS, ParseErrorKind.UNKNOWN_TOOL)


@dataclass
class ParseResult:
    content: str  # text outside the calls (stripped)
    tool_calls: list[ToolCall] = field(default_factory=list)
    errors: list[ParseError] = field(default_factory=list)

    @property
    def truncated(self) -> bool:
        return any(e.kind is ParseErrorKind.TRUNCATED for e in self.errors)


class Parser:
    name: str = ""

    def parse(
        self,
        text: str,
        tools: dict[str, type[BaseModel]] | None = None,
        truncated: bool = False,
    ) -> ParseResult:
        """Parse one turn. `tools` maps tool name → Args model: unknown names and arguments that
        fail validation become errors. `truncated`: the engine stopped at the length limit."""
        raise NotImplementedError


PARSERS: Registry[type[Parser]] = Registry("tool-call parser", setting="rollout.parser")


def register(name: str) -> Callable[[type[Parser]], type[Parser]]:
    """Class decorator: a Parser subclass under `name` (also sets `cls.name`)."""

    def deco(cls: type[Parser]) -> type[Parser]:
        cls.name = name
        return PARSERS.register(name)(cls)

    return deco


def get_parser(name: str) -> Parser:
    """A fresh parser: a registered name or an import path `module:ParserClass`."""
    if name == "auto" or not (name in PARSERS or is_import_path(name)):
        raise ConfigError(
            f"rollout.parser={name!r}: unknown tool-call parser; known: "
            f"{', '.join(['auto', *PARSERS.names()])}, or an import path `module:ParserClass`"
        )
    cls = PARSERS.get(name)
    if not (isinstance(cls, type) and issubclass(cls, Parser)):
        raise ConfigError(f"rollout.parser={name!r} is not a subclass of agentrl.parsers.Parser")
    return cls()


def resolve_parser(name: str, tokenizer: Any) -> Parser:
    """The parser `rollout.parser` names; `auto`: the one that reads back a tool call the way
    the tokenizer's chat template writes it (`check_template`), or a ConfigError."""
    if name != "auto":
        return get_parser(name)
    tried = []
    for candidate in PARSERS.names():
        parser = get_parser(candidate)
        try:
            check_template(parser, tokenizer)
        except ConfigError as e:
            tried.append(f"{candidate}: {str(e).split(';')[0]}")
            continue
        return parser
    raise ConfigError(
        "rollout.parser=auto: no known parser reads tool calls the way this model's chat "
        "template writes them (" + " | ".join(tried)[:600] + "); register a parser for the "
        "template's format and set rollout.parser to it"
    )


@register("hermes")
class HermesParser(Parser):
    """Qwen2.5/Qwen3 (hermes) style: `<tool_call>{"name": …, "arguments": {…}}</tool_call>`, any number."""

    open_tag, close_tag = "<tool_call>", "</tool_call>"

    def parse(self, text, tools=None, truncated=False) -> ParseResult:
        prose: list[str] = []
        calls: list[ToolCall] = []
        errors: list[ParseError] = []
        pos = 0
        while True:
            start = text.find(self.open_tag, pos)
            if start < 0:
                prose.append(text[pos:])
                break
            prose.append(text[pos:start])
            body_start = start + len(self.open_tag)
            # a JSON object then the closing tag: the tags may stand inside its strings (code)
            end, after = self._json_then_close(text, body_start)
            if end < 0:  # not a whole JSON object: the body runs to the closing tag
                end = text.find(self.close_tag, body_start)
                nxt = text.find(self.open_tag, body_start)
                if end < 0 or 0 <= nxt < end:
                    stop = len(text) if nxt < 0 else nxt
                    kind = (
                        ParseErrorKind.TRUNCATED
                        if truncated and nxt < 0
                        else ParseErrorKind.UNCLOSED_TAG
                    )
                    msg = f"tool call is missing its closing {self.close_tag} tag"
                    errors.append(ParseError(kind, msg, text[body_start:stop]))
                    pos = stop
                    if nxt < 0:
                        break
                    continue
                after = end + len(self.close_tag)
            pos = after
            call, err = _read_call(text[body_start:end], len(calls) + len(errors), tools)
            if call is not None:
                calls.append(call)
            if err is not None:
                errors.append(err)
        content = "".join(prose).strip()
        return ParseResult(content=content, tool_calls=calls, errors=errors)

    def _json_then_close(self, text: str, i: int) -> tuple[int, int]:
        """(end of the JSON object, end of the closing tag) when a JSON object starts at `i`
        (after white space) and the closing tag follows it; else (-1, -1)."""
        i = _SPACE.match(text, i).end()
        if text.startswith("{", i):
            with contextlib.suppress(ValueError, RecursionError):
                _, end = _DECODER.raw_decode(text, i)
                close = _SPACE.match(text, end).end()
                if text.startswith(self.close_tag, close):
                    return end, close + len(self.close_tag)
        return -1, -1


_DECODER = json.JSONDecoder()
_SPACE = re.compile(r"\s*")


def _read_call(
    raw: str, index: int, tools: dict[str, type[BaseModel]] | None, *, raw_text: str | None = None
) -> tuple[ToolCall | None, ParseError | None]:
    """Read one JSON call body; `raw_text` is what errors quote (default: `raw`)."""
    quote = raw if raw_text is None else raw_text
    try:
        obj = json.loads(raw)
    except (ValueError, RecursionError) as e:
        return None, ParseError(
            ParseErrorKind.BAD_JSON, f"tool call is not valid JSON ({e})", quote
        )
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return None, ParseError(
            ParseErrorKind.NOT_A_CALL,
            'tool call must be a JSON object {"name": <tool>, "arguments": {...}}',
            quote,
        )
    name = obj["name"]
    args: Any = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(args, str):  # some models emit arguments as a JSON string
        with contextlib.suppress(ValueError, RecursionError):
            args = json.loads(args)
    if not isinstance(args, dict):
        return None, ParseError(
            ParseErrorKind.NOT_A_CALL, f"arguments of '{name}' must be a JSON object", quote, name
        )
    if tools is not None:
        if name not in tools:
            return None, ParseError(
                ParseErrorKind.UNKNOWN_TOOL,
                f"unknown tool '{name}'; available tools: {', '.join(sorted(tools)) or 'none'}",
                quote,
                name,
            )
        try:
            tools[name].model_validate(args)
        except ValidationError as e:
            detail = "; ".join(
                f"{'.'.join(map(str, x['loc'])) or '<args>'}: {x['msg']}" for x in e.errors()
            )
            return None, ParseError(
                ParseErrorKind.INVALID_ARGS,
                f"invalid arguments for '{name}': {detail}",
                quote,
                name,
            )
    return ToolCall(id=f"call_{index}", name=name, arguments=args), None


@register("qwen3_coder")
class Qwen3CoderParser(Parser):
    """Qwen3-Coder / Qwen3.5+ XML form, any number of calls:

        <tool_call>
        <function=python>
        <parameter=code>
        print(1)
        </parameter>
        </function>
        </tool_call>

    Parameter values are text (one leading and one trailing newline dropped); a value whose
    field in the tool's Args is not a string is read as JSON (numbers, booleans, lists, objects),
    else kept as text for the Args model to judge.
    """

    open_tag, close_tag = "<tool_call>", "</tool_call>"
    _FUNC = re.compile(r"\s*<function=([^>\n]+)>(.*?)</function>\s*$", re.S)
    _PARAM = re.compile(r"<parameter=([^>\n]+)>(.*?)</parameter>", re.S)

    def parse(self, text, tools=None, truncated=False) -> ParseResult:
        prose: list[str] = []
        calls: list[ToolCall] = []
        errors: list[ParseError] = []
        pos = 0
        while True:
            start = text.find(self.open_tag, pos)
            if start < 0:
                prose.append(text[pos:])
                break
            prose.append(text[pos:start])
            body_start = start + len(self.open_tag)
            end = text.find(self.close_tag, body_start)
            if end < 0:
                kind = ParseErrorKind.TRUNCATED if truncated else ParseErrorKind.UNCLOSED_TAG
                msg = f"tool call is missing its closing {self.close_tag} tag"
                errors.append(ParseError(kind, msg, text[body_start:]))
                break
            pos = end + len(self.close_tag)
            call, err = self._read(text[body_start:end], len(calls) + len(errors), tools)
            if call is not None:
                calls.append(call)
            if err is not None:
                errors.append(err)
        return ParseResult(content="".join(prose).strip(), tool_calls=calls, errors=errors)

    def _read(
        self, raw: str, index: int, tools: dict[str, type[BaseModel]] | None
    ) -> tuple[ToolCall | None, ParseError | None]:
        m = self._FUNC.match(raw)
        if m is None:
            return None, ParseError(
                ParseErrorKind.NOT_A_CALL,
                "tool call must be <function=NAME> with <parameter=KEY>VALUE</parameter> inside, "
                "closed by </function>",
                raw,
            )
        name, body = m.group(1).strip(), m.group(2)
        model = (tools or {}).get(name)
        args: dict[str, Any] = {}
        for key, value in self._PARAM.findall(body):
            key = key.strip()
            value = value.removeprefix("\n").removesuffix("\n")
            args[key] = _typed(value, model, key)
        return _checked_call(name, args, raw, index, tools)


@register("llama3_json")
class Llama3JsonParser(Parser):
    """Llama 3.1 / 3.2 JSON tool calls: the turn is `{"name": …, "parameters": {…}}` (optionally
    after <|python_tag|>; several calls separated by ';'). Text that does not start with `{` is a
    plain answer; a turn that starts with `{` but is not a call is a parse error."""

    tag = "<|python_tag|>"

    def parse(self, text, tools=None, truncated=False) -> ParseResult:
        body = text.strip()
        tagged = body.startswith(self.tag)
        body = body.removeprefix(self.tag).strip()
        if not body.startswith("{"):
            return ParseResult(content=text.strip())
        calls: list[ToolCall] = []
        errors: list[ParseError] = []
        pos = 0
        while pos < len(body):
            try:
                _, end = _DECODER.raw_decode(body, pos)
            except (ValueError, RecursionError) as e:
                kind = ParseErrorKind.TRUNCATED if truncated else ParseErrorKind.BAD_JSON
                errors.append(ParseError(kind, f"tool call is not valid JSON ({e})", body[pos:]))
                break
            call, err = _read_call(body[pos:end], len(calls) + len(errors), tools)
            if call is not None:
                calls.append(call)
            if err is not None:
                errors.append(err)
            pos = _SPACE.match(body, end).end()
            if body.startswith(";", pos):
                pos = _SPACE.match(body, pos + 1).end()
            elif pos < len(body):
                errors.append(
                    ParseError(ParseErrorKind.BAD_JSON, "text after the tool call", body[pos:])
                )
                break
        if not calls and not errors and not tagged:
            return ParseResult(content=text.strip())
        return ParseResult(content="", tool_calls=calls, errors=errors)


def _typed(value: str, model: type[BaseModel] | None, key: str) -> Any:
    """A parameter's text as the tool's Args field wants it: JSON unless the field is a str."""
    field_info = model.model_fields.get(key) if model is not None else None
    if field_info is not None and field_info.annotation is str:
        return value
    try:
        return json.loads(value)
    except (ValueError, RecursionError):
        return value


def _checked_call(
    name: str, args: dict[str, Any], raw: str, index: int, tools: dict[str, type[BaseModel]] | None
) -> tuple[ToolCall | None, ParseError | None]:
    return _read_call(json.dumps({"name": name, "arguments": args}), index, tools, raw_text=raw)


_PROBE_ARGS = {"probe": "x"}


def check_template(parser: Parser, tokenizer: Any) -> None:
    """Fail at start-up unless the chat template renders an assistant tool call that `parser` reads back."""
    call = ToolCall(id="call_0", name="probe_tool", arguments=_PROBE_ARGS)
    base = [{"role": "user", "content": "hi"}]
    with_call = base + [{"role": "assistant", "content": "", "tool_calls": [call.to_template()]}]
    try:
        rendered = tokenizer.apply_chat_template(with_call, tokenize=False)
        prefix = tokenizer.apply_chat_template(base, tokenize=False, add_generation_prompt=True)
    except Exception as e:
        raise ConfigError(
            f"the model's chat template cannot render tool calls ({type(e).__name__}: {e}); "
            "use a model/tokenizer whose chat template supports tools"
        ) from e
    tail = rendered[len(prefix) :] if rendered.startswith(prefix) else rendered
    eos = getattr(tokenizer, "eos_token", None)
    tail = tail.rstrip()
    if eos and tail.endswith(eos):  # the turn's end marker is not part of what is parsed
        tail = tail[: -len(eos)]
    res = parser.parse(tail)
    ok = [c for c in res.tool_calls if c.name == "probe_tool" and c.arguments == _PROBE_ARGS]
    if not ok:
        raise ConfigError(
            f"tool-call parser {parser.name!r} cannot read tool calls the way this model's chat "
            f"template writes them (rendered: {tail[:160]!r}); set rollout.parser to the model's "
            f"format (known: {PARSERS.names()})"
        )
