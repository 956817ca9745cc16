"""Kimi-K2 tool calls: a section of calls, each named by an id `functions.NAME:INDEX`."""

from __future__ import annotations

import re

from agentrl.parsers.base import ParseError, ParseErrorKind, SectionParser, named_call, register

ARGS = "<|tool_call_argument_begin|>"
# what SGLang's kimi_k2 detector accepts as an id: markup or text in it would be echoed into the
# tool result's header (`## Return of <id>`) as the template's own (a red-team pass)
CALL_ID = re.compile(r"functions\.([\w.\-]+):\d+")


@register("kimi_k2")
class KimiK2Parser(SectionParser):
    """Kimi-K2's form (SGLang's kimi_k2 detector reads the same), any number of calls:

        <|tool_calls_section_begin|><|tool_call_begin|>functions.python:0<|tool_call_argument_begin|>{"code": "print(1)"}<|tool_call_end|><|tool_calls_section_end|>

    The call's id is what the model wrote (`functions.python:0`): the tool's result is returned
    under it (`## Return of functions.python:0`), so the id is kept as the call's id; the tool is
    the part between `functions.` and the last `:`. An id of another form (`CALL_ID`) is a parse
    error: it would be echoed into the result's header."""

    section = ("<|tool_calls_section_begin|>", "<|tool_calls_section_end|>")
    call = ("<|tool_call_begin|>", "<|tool_call_end|>")

    def _read(self, body, index, tools):
        call_id, sep, raw = body.partition(ARGS)
        call_id = call_id.strip()
        valid = CALL_ID.fullmatch(call_id)
        name = valid.group(1) if valid else ""
        if not sep or not name:
            msg = f"tool call must be functions.NAME:INDEX{ARGS}ARGUMENTS"
            return None, ParseError(ParseErrorKind.NOT_A_CALL, msg, body)
        call, err = named_call(name, raw, body, index, tools)
        return (call.model_copy(update={"id": call_id}) if call else None), err
