"""The parsers' common ground: the result records, the `Parser` base and its registry
(`rollout.parser` names), the JSON call reader the formats share, and the start-up checks of a chat
template against a parser (`check_template`, `template_max_calls`). The formats are one module each
(hermes.py, qwen3_coder.py, llama3.py); `agentrl.parsers` imports them all."""

from __future__ import annotations

import contextlib
import json
import logging
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from pydantic import BaseModel, ValidationError

from agentrl.registry import Registry, is_import_path
from agentrl.types import ConfigError, Message, ToolCall

log = logging.getLogger(__name__)
_RAISED: set[type] = set()  # exception types a parser raised (warned once each)


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
    reasoning: str | None = None  # the turn's reasoning, where the format marks it apart

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
        one error the model reads, instead of a turn the template fails to render. A reasoning
        block (`<think>…</think>`, or one the turn never closed) is set apart first, as SGLang's
        reasoning parsers do: calls written while thinking do not run, and it is not content."""
        thought, text = split_reasoning(text)
        try:
            res = self.parse(text, tools, truncated)
        except Exception as e:  # noqa: BLE001 - the model's text broke the parser: its error
            if type(e) not in _RAISED:  # loud once: it may be a parser bug, not the model
                _RAISED.add(type(e))
                log.warning("parser %s raised %s on a turn (counted as the model's parse error): "
                            "%s", type(self).__name__, type(e).__name__, e)  # fmt: skip
            msg = f"this turn could not be read for tool calls ({type(e).__name__}); none ran"
            res = ParseResult(text.strip(), [], [ParseError(ParseErrorKind.NOT_A_CALL, msg)])
        if thought is not None:
            res.reasoning = thought if res.reasoning is None else f"{thought}\n{res.reasoning}"
        made = len(res.tool_calls) + sum(e.is_call_error for e in res.errors)
        if self.max_calls is None or made <= self.max_calls:
            return res
        limit = f"{self.max_calls} tool call" + ("s" if self.max_calls > 1 else "")
        msg = f"this model's chat template allows {limit} per turn; this turn made {made}, so "
        msg += "none of them ran. Make one call, read its result, then make the next"
        kept = [e for e in res.errors if not e.is_call_error]
        errors = [ParseError(ParseErrorKind.TOO_MANY_CALLS, msg, text), *kept]
        return ParseResult(res.content, [], errors, res.reasoning)

    def parse(
        self,
        text: str,
        tools: dict[str, type[BaseModel]] | None = None,
        truncated: bool = False,
    ) -> ParseResult:
        """Parse one turn. `tools` maps tool name → Args model: unknown names and arguments that
        fail validation become errors. `truncated`: the engine stopped at the length limit."""
        raise NotImplementedError


THINK = ("<think>", "</think>")


def split_reasoning(text: str) -> tuple[str | None, str]:
    """(the turn's reasoning block, the rest). The block runs to the first `</think>` (from a
    `<think>` the turn opened, or one the prompt opened, DeepSeek's and Qwen3's thinking
    prefills); a `<think>` never closed (a length cut) holds the whole turn; no tags: (None, text)."""
    opened, closed = THINK
    head, sep, rest = text.partition(closed)
    if sep:
        return head.strip().removeprefix(opened).strip(), rest
    if text.lstrip().startswith(opened):
        return text.lstrip()[len(opened) :].strip(), ""
    return None, text


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
    try:
        tail = rendered_call(tokenizer)
    except ConfigError as e:
        raise ConfigError(f"rollout.parser=auto: {e}") from e
    for candidate in PARSERS.names():
        parser = get_parser(candidate, max_calls)
        if _reads(parser, tail):
            return parser
    known = [f for marker, f in UNREAD_FORMATS.items() if marker in tail]
    which = f", {known[0]} format," if known else ""
    raise ConfigError(
        f"rollout.parser=auto: this model's chat template writes a tool call as {tail[:200]!r}"
        f"{which} which none of agentrl's parsers reads ({', '.join(PARSERS.names())}; "
        "docs/models.md lists the model families they cover). Register a parser for the "
        "format (docs/rollouts.md) and set rollout.parser to it"
    )


JSON_DECODER = json.JSONDecoder()
SPACE = re.compile(r"\s*")


def next_block(text: str, open_tag: str, pos: int, prose: list[str]) -> int | None:
    """Where the body of the next `open_tag` block at or after `pos` starts, with the prose before
    it appended to `prose`; None (the rest appended) when there is none. The tagged formats'
    scanning step (hermes, qwen3_coder)."""
    start = text.find(open_tag, pos)
    if start < 0:
        prose.append(text[pos:])
        return None
    prose.append(text[pos:start])
    return start + len(open_tag)


MAX_ARG_DEPTH = 32  # a red-team call nested 600 lists: the run stopped writing its trajectory


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def strict_json(raw: str) -> Any:
    """JSON as JSON has it: NaN and Infinity, which Python's json reads, are bad JSON (the
    gateway answered them as an agent's arguments, which no parser outside Python reads, and
    NaN != NaN forked the episode when the agent echoed the call)."""
    return json.loads(raw, parse_constant=_no_constant)


def _deeper_than(value: Any, limit: int) -> bool:
    stack = [(value, 0)]
    while stack:
        v, depth = stack.pop()
        if depth > limit:
            return True
        if isinstance(v, dict | list):
            stack.extend((x, depth + 1) for x in (v.values() if isinstance(v, dict) else v))
    return False


def read_call(
    raw: str, index: int, tools: dict[str, type[BaseModel]] | None, *, raw_text: str | None = None
) -> tuple[ToolCall | None, ParseError | None]:
    """Read one JSON call body; `raw_text` is what errors quote (default: `raw`)."""
    quote = raw if raw_text is None else raw_text
    try:
        obj = strict_json(raw)
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
            args = strict_json(args)
    if not isinstance(args, dict):
        return None, ParseError(
            ParseErrorKind.NOT_A_CALL, f"arguments of '{name}' must be a JSON object", quote, name
        )
    if _deeper_than(args, MAX_ARG_DEPTH):  # a record that deep breaks deepcopy and json.dumps
        msg = f"arguments of '{name}' nest deeper than {MAX_ARG_DEPTH} levels"
        return None, ParseError(ParseErrorKind.BAD_JSON, msg, quote, name)
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


def typed_value(value: str, model: type[BaseModel] | None, key: str) -> Any:
    """A parameter's text as the tool's Args field wants it: JSON unless the field is a str."""
    field_info = model.model_fields.get(key) if model is not None else None
    if field_info is not None and field_info.annotation is str:
        return value
    try:
        return strict_json(value)  # NaN stays the text it is
    except (ValueError, RecursionError):
        return value


def checked_call(
    name: str, args: dict[str, Any], raw: str, index: int, tools: dict[str, type[BaseModel]] | None
) -> tuple[ToolCall | None, ParseError | None]:
    return read_call(json.dumps({"name": name, "arguments": args}), index, tools, raw_text=raw)


def named_call(
    name: str,
    raw: str,
    quote: str,
    index: int,
    tools: dict[str, type[BaseModel]] | None,
    cut: bool = False,
) -> tuple[ToolCall | None, ParseError | None]:
    """The call to `name` whose arguments are the JSON object `raw` (empty: none), checked
    against `tools`; `quote` is what errors quote, `cut`: the turn ended at the length limit
    inside it (bad JSON is then truncated). The formats that write the name apart from its JSON
    arguments (harmony, deepseek_v3, kimi_k2)."""
    try:
        args = json.loads(raw) if raw.strip() else {}
    except (ValueError, RecursionError) as e:
        kind = ParseErrorKind.TRUNCATED if cut else ParseErrorKind.BAD_JSON
        msg = f"arguments of the call to '{name}' are not valid JSON ({e})"
        return None, ParseError(kind, msg, quote, name)
    if not isinstance(args, dict):
        msg = f"arguments of '{name}' must be a JSON object"
        return None, ParseError(ParseErrorKind.NOT_A_CALL, msg, quote, name)
    return checked_call(name, args, quote, index, tools)


class SectionParser(Parser):
    """Formats that put a turn's calls in one section of markup-delimited calls (deepseek_v3,
    kimi_k2): `section` and `call` are the (open, close) tags, `_read` reads one call's body.
    Text outside the section is the content; a call the turn never closes is truncated (at the
    length limit) or unclosed; a section missing only its closing tag runs its whole calls, as
    SGLang's detectors do."""

    section: tuple[str, str] = ("", "")
    call: tuple[str, str] = ("", "")

    def parse(self, text, tools=None, truncated=False) -> ParseResult:
        begin, end = self.section
        at = text.find(begin)
        if at < 0:
            return ParseResult(text.strip())
        close = text.find(end, at)
        section = text[at + len(begin) : close if close >= 0 else len(text)]
        content = text[:at] + (text[close + len(end) :] if close >= 0 else "")
        calls: list[ToolCall] = []
        errors: list[ParseError] = []
        pos = 0
        while (start := section.find(self.call[0], pos)) >= 0:
            stop = section.find(self.call[1], start)
            body = section[start + len(self.call[0]) : stop if stop >= 0 else len(section)]
            if stop < 0:
                kind = ParseErrorKind.TRUNCATED if truncated else ParseErrorKind.UNCLOSED_TAG
                errors.append(ParseError(kind, "tool call is missing its closing tag", body))
                break
            call, err = self._read(body, len(calls) + len(errors), tools)
            calls += [call] if call is not None else []
            errors += [err] if err is not None else []
            pos = stop + len(self.call[1])
        return ParseResult(content.strip(), calls, errors)

    def _read(
        self, body: str, index: int, tools: dict[str, type[BaseModel]] | None
    ) -> tuple[ToolCall | None, ParseError | None]:
        raise NotImplementedError


class ScannedParser(Parser):
    """Formats whose call is a name and key/value pairs inside <tool_call>…</tool_call>, read by
    scanning the structure from the opening tag (qwen3_coder, glm45). A subclass gives `_scan`
    (name, pairs and the end of the closing tag for a call that reads whole, else None) and
    `shape` (what a call must look like); a body that does not scan runs to the first closing
    tag and is read by `_read` (default: a NOT_A_CALL error naming the shape). Values are typed by
    the tool's Args (`typed_value`) after `_value` (default: unchanged)."""

    open_tag, close_tag = "<tool_call>", "</tool_call>"
    shape = ""

    def parse(self, text, tools=None, truncated=False) -> ParseResult:
        prose: list[str] = []
        calls: list[ToolCall] = []
        errors: list[ParseError] = []
        pos = 0
        while (start := next_block(text, self.open_tag, pos, prose)) is not None:
            index = len(calls) + len(errors)
            read = self._scan(text, start)
            if read is not None:
                name, pairs, pos = read
                call, err = self._call(name, pairs, text[start:pos], index, tools)
            else:  # not the call's structure: the body runs to the first closing tag
                end = text.find(self.close_tag, start)
                if end < 0:
                    kind = ParseErrorKind.TRUNCATED if truncated else ParseErrorKind.UNCLOSED_TAG
                    msg = f"tool call is missing its closing {self.close_tag} tag"
                    errors.append(ParseError(kind, msg, text[start:]))
                    break
                pos = end + len(self.close_tag)
                call, err = self._read(text[start:end], index, tools)
            if call is not None:
                calls.append(call)
            if err is not None:
                errors.append(err)
        return ParseResult(content="".join(prose).strip(), tool_calls=calls, errors=errors)

    def _scan(self, text: str, i: int) -> tuple[str, list[tuple[str, str]], int] | None:
        raise NotImplementedError

    def _read(
        self, raw: str, index: int, tools: dict[str, type[BaseModel]] | None
    ) -> tuple[ToolCall | None, ParseError | None]:
        return None, ParseError(ParseErrorKind.NOT_A_CALL, self.shape, raw)

    def _value(self, value: str) -> str:
        return value

    def _call(
        self,
        name: str,
        pairs: list[tuple[str, str]],
        raw: str,
        index: int,
        tools: dict[str, type[BaseModel]] | None,
    ) -> tuple[ToolCall | None, ParseError | None]:
        model = (tools or {}).get(name)
        args = {key: typed_value(self._value(value), model, key) for key, value in pairs}
        return checked_call(name, args, raw, index, tools)


_PROBE_ARGS = {"probe": "x"}


# formats no parser here reads, named in the start-up error when a template writes them
UNREAD_FORMATS = {
    "<|tool_call>call:": "Gemma 4's (<|tool_call>call:NAME{…}<tool_call|>)",
    "[TOOL_CALLS]": "Mistral's ([TOOL_CALLS][…])",
    "<|tool_call_start|>": "LFM2's (<|tool_call_start|>[NAME(…)]<|tool_call_end|>)",
    "Action:": "Cohere's (Action: ```json […]```)",
    "<|python_start|>": "Llama 4's (<|python_start|>…<|python_end|>)",
}


def rendered_call(tokenizer: Any) -> str:
    """The text the chat template writes for an assistant turn calling `probe_tool` (after its
    generation prompt, without the end of turn); ConfigError when it cannot render one."""
    call = ToolCall(id="call_0", name="probe_tool", arguments=_PROBE_ARGS)
    base = [{"role": "user", "content": "hi"}]

    def with_call(string_args: bool) -> list[dict[str, Any]]:
        asked = {"role": "assistant", "content": "", "tool_calls": [call.to_template(string_args)]}
        return [*base, asked]

    try:
        try:
            rendered = tokenizer.apply_chat_template(with_call(False), tokenize=False)
        except TypeError:  # a template that concatenates the arguments as text (DeepSeek-V3)
            rendered = tokenizer.apply_chat_template(with_call(True), tokenize=False)
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
    if "probe_tool" not in tail:
        raise ConfigError(
            "the model's chat template renders no tool calls (an assistant message's tool_calls "
            f"do not appear in its rendering: {tail[-160:]!r}), so the model never learned to "
            "call tools in it; use a model/tokenizer whose chat template supports tools"
        )
    return tail


def _reads(parser: Parser, tail: str) -> bool:
    res = parser.parse(tail)
    return any(c.name == "probe_tool" and c.arguments == _PROBE_ARGS for c in res.tool_calls)


def check_template(parser: Parser, tokenizer: Any) -> None:
    """Fail at start-up unless the chat template renders an assistant tool call that `parser` reads back."""
    tail = rendered_call(tokenizer)
    if not _reads(parser, tail):
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
