"""GLM-4.5 / 4.6 / 4.7 tool calls: the function name, then `<arg_key>`/`<arg_value>` pairs."""

from __future__ import annotations

import re

from pydantic import BaseModel

from agentrl.parsers.base import (
    ParseError,
    ParseErrorKind,
    Parser,
    ParseResult,
    checked_call,
    next_block,
    register,
    typed_value,
)
from agentrl.types import ToolCall


@register("glm45")
class Glm45Parser(Parser):
    """GLM-4.5's form (also GLM-4.6 and 4.7, whose templates put no newlines between the parts),
    any number of calls in a turn:

        <tool_call>python
        <arg_key>code</arg_key>
        <arg_value>print(1)</arg_value>
        </tool_call>

    The name runs from the tag to the first `<arg_key>` (or the closing tag: a call with no
    arguments). A value whose field in the tool's Args is not a string is read as JSON (numbers,
    booleans, lists, objects: the template writes them with `tojson`), else kept as text, as
    SGLang's glm4_moe detector types them by the tool's schema. A call's end is the first
    `</tool_call>` after its last `</arg_value>`, so a value that contains the closing tag stays
    whole; a key without its value, or text between the pairs, is a malformed call the model reads.
    """

    open_tag, close_tag = "<tool_call>", "</tool_call>"
    _NAME = re.compile(r"([^<\n]*)\s*")
    _PAIR = re.compile(r"<arg_key>(.*?)</arg_key>\s*<arg_value>(.*?)</arg_value>\s*", re.S)
    _END = re.compile(r"\s*</tool_call>")

    def parse(self, text, tools=None, truncated=False) -> ParseResult:
        prose: list[str] = []
        calls: list[ToolCall] = []
        errors: list[ParseError] = []
        pos = 0
        while (start := next_block(text, self.open_tag, pos, prose)) is not None:
            index = len(calls) + len(errors)
            read = self._scan(text, start)
            if read is None:  # not the call's structure: the body runs to the first closing tag
                end = text.find(self.close_tag, start)
                if end < 0:
                    kind = ParseErrorKind.TRUNCATED if truncated else ParseErrorKind.UNCLOSED_TAG
                    msg = f"tool call is missing its closing {self.close_tag} tag"
                    errors.append(ParseError(kind, msg, text[start:]))
                    break
                pos = end + len(self.close_tag)
                errors.append(ParseError(
                    ParseErrorKind.NOT_A_CALL,
                    "tool call must be the function's name, then <arg_key>KEY</arg_key>"
                    "<arg_value>VALUE</arg_value> pairs, closed by </tool_call>",
                    text[start:end],
                ))  # fmt: skip
                continue
            name, pairs, pos = read
            call, err = self._call(name, pairs, text[start:pos], index, tools)
            if call is not None:
                calls.append(call)
            if err is not None:
                errors.append(err)
        return ParseResult(content="".join(prose).strip(), tool_calls=calls, errors=errors)

    def _scan(self, text: str, i: int) -> tuple[str, list[tuple[str, str]], int] | None:
        """(name, [(key, value)], end of </tool_call>) for a call that reads whole from `i`."""
        m = self._NAME.match(text, i)
        name, i = m.group(1).strip(), m.end()
        if not name:
            return None
        pairs = []
        while (p := self._PAIR.match(text, i)) is not None:
            pairs.append((p.group(1).strip(), p.group(2)))
            i = p.end()
        end = self._END.match(text, i)
        return None if end is None else (name, pairs, end.end())

    def _call(
        self,
        name: str,
        pairs: list[tuple[str, str]],
        raw: str,
        index: int,
        tools: dict[str, type[BaseModel]] | None,
    ) -> tuple[ToolCall | None, ParseError | None]:
        model = (tools or {}).get(name)
        return checked_call(
            name, {k: typed_value(v, model, k) for k, v in pairs}, raw, index, tools
        )
