"""GLM-4.5 / 4.6 / 4.7 tool calls: the function name, then `<arg_key>`/`<arg_value>` pairs."""

from __future__ import annotations

import re

from agentrl.parsers.base import ScannedParser, register


@register("glm45")
class Glm45Parser(ScannedParser):
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

    shape = (
        "tool call must be the function's name, then <arg_key>KEY</arg_key>"
        "<arg_value>VALUE</arg_value> pairs, closed by </tool_call>"
    )
    _NAME = re.compile(r"([^<\n]*)\s*")
    _PAIR = re.compile(r"<arg_key>(.*?)</arg_key>\s*<arg_value>(.*?)</arg_value>\s*", re.S)
    _END = re.compile(r"\s*</tool_call>")

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
