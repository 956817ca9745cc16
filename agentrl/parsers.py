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

import ast
import contextlib
import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from pydantic import BaseModel, ValidationError

from agentrl.registry import Registry, is_import_path
from agentrl.types import ConfigError, Message, ToolCall


class ParseErrorKind(StrEnum):
    BAD_JSON = "bad_json"
    NOT_A_CALL = "not_a_call"  # JSON, but not {"name": str, "arguments": object}
    UNCLOSED_TAG = "unclosed_tag"
    TRUNCATED = "truncated"  # unclosed because the length limit cut it
    UNKNOWN_TOOL = "unknown_tool"
    INVALID_ARGS = "invalid_args"
    TOO_MANY_CALLS = "too_many_calls"  # more calls than the chat template can write in one turn


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
    """Subclasses implement `parse`; the rollout calls `parse_turn` (parse, then the template's
    limit on calls per turn)."""

    name: str = ""

    def __init__(self, max_calls: int | None = None) -> None:
        self.max_calls = max_calls  # calls one turn may hold (`template_max_calls`); None: any

    def parse_turn(
        self,
        text: str,
        tools: dict[str, type[BaseModel]] | None = None,
        truncated: bool = False,
    ) -> ParseResult:
        """`parse`, then a turn with more calls than the template can write runs none of them:
        one error the model reads, instead of a turn the template fails to render."""
        res = self.parse(text, tools, truncated)
        made = len(res.tool_calls) + sum(e.is_call_error for e in res.errors)
        if self.max_calls is None or made <= self.max_calls:
            return res
        limit = f"{self.max_calls} tool call" + ("s" if self.max_calls > 1 else "")
        msg = f"this model's chat template allows {limit} per turn; this turn made {made}, so "
        msg += "none of them ran. Make one call, read its result, then make the next"
        kept = [e for e in res.errors if not e.is_call_error]
        return ParseResult(
            res.content, [], [ParseError(ParseErrorKind.TOO_MANY_CALLS, msg, text), *kept]
        )

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


def get_parser(name: str, max_calls: int | None = None) -> Parser:
    """A fresh parser: a registered name or an import path `module:ParserClass`; `max_calls`:
    the most tool calls one turn may hold (`template_max_calls`)."""
    if name == "auto" or not (name in PARSERS or is_import_path(name)):
        raise ConfigError(
            f"rollout.parser={name!r}: unknown tool-call parser; known: "
            f"{', '.join(['auto', *PARSERS.names()])}, or an import path `module:ParserClass`"
        )
    cls = PARSERS.get(name)
    if not (isinstance(cls, type) and issubclass(cls, Parser)):
        raise ConfigError(f"rollout.parser={name!r} is not a subclass of agentrl.parsers.Parser")
    return cls() if max_calls is None else cls(max_calls=max_calls)


def resolve_parser(name: str, tokenizer: Any, max_calls: int | None = None) -> Parser:
    """The parser `rollout.parser` names; `auto`: the one that reads back a tool call the way
    the tokenizer's chat template writes it (`check_template`), or a ConfigError."""
    if name != "auto":
        return get_parser(name, max_calls)
    tried = []
    for candidate in PARSERS.names():
        parser = get_parser(candidate, max_calls)
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
    else kept as text for the Args model to judge. A `</parameter>` closes a value only where the
    call goes on after it (the next `<parameter=` or `</function>`), so code that prints the tag
    runs whole; a value without its `</parameter>` runs to the next parameter or `</function>`
    (as SGLang's qwen3_coder detector reads it).
    """

    open_tag, close_tag = "<tool_call>", "</tool_call>"
    _FUNC = re.compile(r"\s*<function=([^>\n]+)>(.*?)</function>\s*$", re.S)
    _PARAM = re.compile(r"<parameter=([^>\n]+)>(.*?)</parameter>", re.S)
    _FUNC_OPEN = re.compile(r"\s*<function=([^>\n]+)>")
    _PARAM_OPEN = re.compile(r"\s*<parameter=([^>\n]+)>")
    _PARAM_CLOSE = re.compile(r"</parameter>\s*(?=<parameter=|</function>)")
    _FUNC_END = re.compile(r"\s*</function>\s*</tool_call>")
    _NEXT_PARAM = re.compile(r"(?<=\n)<parameter=[^>\n]+>\n")  # one on a line of its own

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
            index = len(calls) + len(errors)
            read = self._scan(text, body_start)
            if read is not None:
                name, params, pos = read
                raw = text[body_start:pos]
                call, err = self._call(name, params, raw, index, tools)
            else:  # not the call's structure: the body runs to the first closing tag
                end = text.find(self.close_tag, body_start)
                if end < 0:
                    kind = ParseErrorKind.TRUNCATED if truncated else ParseErrorKind.UNCLOSED_TAG
                    msg = f"tool call is missing its closing {self.close_tag} tag"
                    errors.append(ParseError(kind, msg, text[body_start:]))
                    break
                pos = end + len(self.close_tag)
                call, err = self._read(text[body_start:end], index, tools)
            if call is not None:
                calls.append(call)
            if err is not None:
                errors.append(err)
        return ParseResult(content="".join(prose).strip(), tool_calls=calls, errors=errors)

    def _scan(self, text: str, i: int) -> tuple[str, list[tuple[str, str]], int] | None:
        """(name, [(key, value)], end of </tool_call>) for a call whose structure reads whole
        from `i`; None otherwise."""
        m = self._FUNC_OPEN.match(text, i)
        if m is None:
            return None
        name, i = m.group(1).strip(), m.end()
        params: list[tuple[str, str]] = []
        while (p := self._PARAM_OPEN.match(text, i)) is not None:
            value_end, i = self._value_end(text, p.end())
            if value_end < 0:
                return None
            params.append((p.group(1).strip(), text[p.end() : value_end]))
        end = self._FUNC_END.match(text, i)
        return None if end is None else (name, params, end.end())

    def _value_end(self, text: str, start: int) -> tuple[int, int]:
        """(end of the value starting at `start`, where the call goes on); (-1, -1) if none."""
        opener = text.find(self.open_tag, start)  # the next call: this value cannot reach it
        limit = len(text) if opener < 0 else opener
        close = self._PARAM_CLOSE.search(text, start)
        nxt = self._NEXT_PARAM.search(text, start, limit)
        if (
            close is not None
            and close.start() < limit
            and (nxt is None or close.start() < nxt.start())
        ):
            return close.start(), close.start() + len("</parameter>")
        # no </parameter>: up to the next parameter, else the function's end
        end = self._FUNC_END.search(text, start, limit)
        if nxt is not None and (end is None or nxt.start() < end.start()):
            return nxt.start(), nxt.start()
        return (end.start(), end.start()) if end is not None else (-1, -1)

    def _call(
        self,
        name: str,
        params: list[tuple[str, str]],
        raw: str,
        index: int,
        tools: dict[str, type[BaseModel]] | None,
    ) -> tuple[ToolCall | None, ParseError | None]:
        model = (tools or {}).get(name)
        args = {
            key: _typed(value.removeprefix("\n").removesuffix("\n"), model, key)
            for key, value in params
        }
        return _checked_call(name, args, raw, index, tools)

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
        return self._call(m.group(1).strip(), self._PARAM.findall(m.group(2)), raw, index, tools)


@register("llama3_json")
class Llama3JsonParser(Parser):
    """Llama 3.1 / 3.2 tool calls, as the model card writes them (SGLang's llama3 detector reads
    the same forms):

    - JSON: `{"name": …, "parameters": {…}}`, optionally after <|python_tag|>; several calls
      separated by ';' or new lines, or as one JSON array `[{…}, {…}]`;
    - <|python_tag|> then code that is not JSON: a call to Llama 3.1's built-in code
      interpreter, run by the env's python tool (`python`, `code_interpreter` or `ipython`; its
      `code` field, or its one string field), else an error the model reads;
    - <|python_tag|>brave_search.call(query="…") (Llama 3.1 built-in tools): the env's tool of
      that name, else an error the model reads.

    A turn ends with <|eot_id|>, or <|eom_id|> when it waits for a tool result: neither is part
    of the call. Text before <|python_tag|> is prose; untagged text that does not start with `{`
    (or `[{"name"`) is a plain answer; one that does but is not a call is a parse error."""

    tag = "<|python_tag|>"
    turn_ends = ("<|eom_id|>", "<|eot_id|>")
    interpreters = ("python", "code_interpreter", "ipython")
    builtins = ("brave_search", "wolfram_alpha")
    _CALL_LIST = re.compile(r'\[\s*\{\s*"name"')

    def parse(self, text, tools=None, truncated=False) -> ParseResult:
        text = text.strip()
        for end in self.turn_ends:
            text = text.removesuffix(end).rstrip()
        at = text.find(self.tag)
        if at >= 0:
            prose, body = text[:at].strip(), text[at + len(self.tag) :].strip()
        elif text.startswith("{") or self._CALL_LIST.match(text):
            prose, body = "", text
        else:
            return ParseResult(content=text)
        if body.startswith(("{", "[")):
            calls, errors = self._json(body, tools, truncated)
        else:
            calls, errors = self._ipython(body, tools, truncated)
        return ParseResult(content=prose, tool_calls=calls, errors=errors)

    def _json(
        self, body: str, tools: dict[str, type[BaseModel]] | None, truncated: bool
    ) -> tuple[list[ToolCall], list[ParseError]]:
        calls: list[ToolCall] = []
        errors: list[ParseError] = []
        pos = 0
        while pos < len(body):
            try:
                obj, end = _DECODER.raw_decode(body, pos)
            except (ValueError, RecursionError) as e:
                kind = ParseErrorKind.TRUNCATED if truncated else ParseErrorKind.BAD_JSON
                errors.append(ParseError(kind, f"tool call is not valid JSON ({e})", body[pos:]))
                break
            items = obj if isinstance(obj, list) and obj else [obj]
            for item in items:  # an array of calls: each one read on its own
                raw = json.dumps(item) if isinstance(obj, list) else body[pos:end]
                call, err = _read_call(raw, len(calls) + len(errors), tools)
                if call is not None:
                    calls.append(call)
                if err is not None:
                    errors.append(err)
            pos = _SPACE.match(body, end).end()
            if body.startswith(";", pos):
                pos = _SPACE.match(body, pos + 1).end()
            elif pos < len(body) and body[pos] not in "{[":
                msg = (
                    "text after the tool call; write only the call(s) in a tool-calling turn, "
                    "separated by ';', and the answer in a turn of its own"
                )
                errors.append(ParseError(ParseErrorKind.BAD_JSON, msg, body[pos:]))
                break
        return calls, errors

    def _ipython(
        self, body: str, tools: dict[str, type[BaseModel]] | None, truncated: bool
    ) -> tuple[list[ToolCall], list[ParseError]]:
        """<|python_tag|> then code: a built-in tool's `name.call(…)`, else the interpreter."""
        if not body:
            msg = 'empty tool call after <|python_tag|>; write {"name": …, "parameters": {…}}'
            return [], [ParseError(ParseErrorKind.NOT_A_CALL, msg, body)]
        if truncated:  # cut code never runs
            msg = "the code after <|python_tag|> was cut by the length limit; it did not run"
            return [], [ParseError(ParseErrorKind.TRUNCATED, msg, body)]
        known = ", ".join(sorted(tools or {})) or "none"
        builtin = self._builtin(body)
        if builtin is not None:
            name, args = builtin
            if name in (tools or {}):
                call, err = _checked_call(name, args, body, 0, tools)
                return ([call] if call else []), ([err] if err else [])
            msg = (
                f"'{name}' is a built-in Llama tool this environment does not have; available "
                f'tools: {known}; call one as JSON: {{"name": <tool>, "parameters": {{…}}}}'
            )
            return [], [ParseError(ParseErrorKind.UNKNOWN_TOOL, msg, body, name)]
        target = self._interpreter(tools)
        if target is None:
            msg = (
                "code after <|python_tag|> calls the built-in code interpreter, which this "
                f"environment does not have; available tools: {known}; call one as JSON: "
                '{"name": <tool>, "parameters": {…}}'
            )
            return [], [ParseError(ParseErrorKind.NOT_A_CALL, msg, body)]
        name, key = target
        call, err = _checked_call(name, {key: body}, body, 0, tools)
        return ([call] if call else []), ([err] if err else [])

    def _builtin(self, body: str) -> tuple[str, dict[str, Any]] | None:
        """(tool, arguments) of `brave_search.call(query="…")`, else None."""
        try:
            node = ast.parse(body, mode="eval").body
        except (SyntaxError, ValueError, RecursionError):
            return None
        if not (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "call"
            and isinstance(node.func.value, ast.Name)
            and node.func.value.id in self.builtins
            and not node.args
        ):
            return None
        args: dict[str, Any] = {}
        for kw in node.keywords:
            try:
                args[str(kw.arg)] = ast.literal_eval(kw.value)
            except (ValueError, TypeError, SyntaxError, RecursionError):
                return None
        return node.func.value.id, args

    def _interpreter(self, tools: dict[str, type[BaseModel]] | None) -> tuple[str, str] | None:
        """(tool, field) that runs the built-in interpreter's code: the env's python tool."""
        for name in self.interpreters:
            model = (tools or {}).get(name)
            if model is None:
                continue
            fields = model.model_fields
            if "code" in fields:
                return name, "code"
            texts = [k for k, f in fields.items() if f.annotation is str and f.is_required()]
            if len(texts) == 1:
                return name, texts[0]
        return None


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


def template_max_calls(render: Callable[[list[Message]], str]) -> int | None:
    """The most tool calls one assistant turn may hold in the chat template `render` applies:
    1 when it refuses a turn with two (Llama 3.x raises "This model only supports single
    tool-calls at once!"), None when it writes them. Probed at start-up so the parser holds a turn
    to what the template can render (`Parser.parse_turn`)."""
    calls = [ToolCall(id=f"call_{i}", name="probe_tool", arguments=_PROBE_ARGS) for i in (0, 1)]
    results = [Message(role="tool", content="42", tool_call_id=c.id, name=c.name) for c in calls]
    user = Message(role="user", content="hi")
    try:
        render([user, Message(role="assistant", content="", tool_calls=calls), *results])
    except Exception:  # the template's own refusal (jinja2 raise_exception, or any error)
        return 1
    return None
