"""Qwen3-Coder / Qwen3.5+ XML tool calls (`<function=…>` with `<parameter=…>`)."""

from __future__ import annotations

import re

from pydantic import BaseModel

from agentrl.parsers.base import ParseError, ScannedParser, register
from agentrl.types import ToolCall


@register("qwen3_coder")
class Qwen3CoderParser(ScannedParser):
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

    shape = (
        "tool call must be <function=NAME> with <parameter=KEY>VALUE</parameter> inside, "
        "closed by </function>"
    )
    _FUNC = re.compile(r"\s*<function=([^>\n]+)>(.*?)</function>\s*$", re.S)
    _PARAM = re.compile(r"<parameter=([^>\n]+)>(.*?)</parameter>", re.S)
    _FUNC_OPEN = re.compile(r"\s*<function=([^>\n]+)>")
    _PARAM_OPEN = re.compile(r"\s*<parameter=([^>\n]+)>")
    _PARAM_CLOSE = re.compile(r"</parameter>\s*(?=<parameter=|</function>)")
    _FUNC_END = re.compile(r"\s*</function>\s*</tool_call>")
    _NEXT_PARAM = re.compile(r"(?<=\n)<parameter=[^>\n]+>\n")  # one on a line of its own

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

    def _value(self, value: str) -> str:
        return value.removeprefix("\n").removesuffix("\n")

    def _read(
        self, raw: str, index: int, tools: dict[str, type[BaseModel]] | None
    ) -> tuple[ToolCall | None, ParseError | None]:
        m = self._FUNC.match(raw)
        if m is None:
            return super()._read(raw, index, tools)
        return self._call(m.group(1).strip(), self._PARAM.findall(m.group(2)), raw, index, tools)
