"""Qwen3-Coder / Qwen3.5+ XML tool calls (`<function=…>` with `<parameter=…>`)."""

from __future__ import annotations

import re

from pydantic import BaseModel

from agentrl.parsers.base import (
    ParseError,
    ParseErrorKind,
    Parser,
    ParseResult,
    checked_call,
    register,
    typed_value,
)
from agentrl.types import ToolCall


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
            key: typed_value(value.removeprefix("\n").removesuffix("\n"), model, key)
            for key, value in params
        }
        return checked_call(name, args, raw, index, tools)

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
