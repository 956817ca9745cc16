"""Llama 3.1 / 3.2 tool calls: JSON, `<|python_tag|>` and the built-in code interpreter."""

from __future__ import annotations

import ast
import json
import re
from typing import Any

from pydantic import BaseModel

from agentrl.parsers.base import (
    JSON_DECODER,
    SPACE,
    ParseError,
    ParseErrorKind,
    Parser,
    ParseResult,
    checked_call,
    read_call,
    register,
)
from agentrl.types import ToolCall


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
                obj, end = JSON_DECODER.raw_decode(body, pos)
            except (ValueError, RecursionError) as e:
                kind = ParseErrorKind.TRUNCATED if truncated else ParseErrorKind.BAD_JSON
                errors.append(ParseError(kind, f"tool call is not valid JSON ({e})", body[pos:]))
                break
            items = obj if isinstance(obj, list) and obj else [obj]
            for item in items:  # an array of calls: each one read on its own
                raw = json.dumps(item) if isinstance(obj, list) else body[pos:end]
                call, err = read_call(raw, len(calls) + len(errors), tools)
                if call is not None:
                    calls.append(call)
                if err is not None:
                    errors.append(err)
            pos = SPACE.match(body, end).end()
            if body.startswith(";", pos):
                pos = SPACE.match(body, pos + 1).end()
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
                call, err = checked_call(name, args, body, 0, tools)
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
        call, err = checked_call(name, {key: body}, body, 0, tools)
        return ([call] if call else []), ([err] if err else [])

    def _builtin(self, body: str) -> tuple[str, dict[str, Any]] | None:
        """(tool, arguments) of `brave_search.call(query="…")`, else None."""
        try:
            node = ast.parse(body, mode="eval").body
        except (SyntaxError, ValueError, RecursionError, MemoryError):  # deep nesting: MemoryError
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
