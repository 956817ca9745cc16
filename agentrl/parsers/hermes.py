"""Hermes tool calls (Qwen2.5 / Qwen3): `<tool_call>{json}</tool_call>`."""

from __future__ import annotations

import contextlib

from agentrl.parsers.base import (
    JSON_DECODER,
    SPACE,
    ParseError,
    ParseErrorKind,
    Parser,
    ParseResult,
    read_call,
    register,
)
from agentrl.types import ToolCall


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
            call, err = read_call(text[body_start:end], len(calls) + len(errors), tools)
            if call is not None:
                calls.append(call)
            if err is not None:
                errors.append(err)
        content = "".join(prose).strip()
        return ParseResult(content=content, tool_calls=calls, errors=errors)

    def _json_then_close(self, text: str, i: int) -> tuple[int, int]:
        """(end of the JSON object, end of the closing tag) when a JSON object starts at `i`
        (after white space) and the closing tag follows it; else (-1, -1)."""
        i = SPACE.match(text, i).end()
        if text.startswith("{", i):
            with contextlib.suppress(ValueError, RecursionError):
                _, end = JSON_DECODER.raw_decode(text, i)
                close = SPACE.match(text, end).end()
                if text.startswith(self.close_tag, close):
                    return end, close + len(self.close_tag)
        return -1, -1
