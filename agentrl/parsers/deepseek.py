"""DeepSeek-V3 / V3.1 tool calls: a section of calls between DeepSeek's own markup tokens."""

from __future__ import annotations

import re

from agentrl.parsers.base import ParseError, ParseErrorKind, SectionParser, named_call, register

SEP = "<｜tool▁sep｜>"
_V3_BODY = re.compile(r"\s*(\S+?)\s*\n```json\s*\n(.*)\n```\s*$", re.S)


@register("deepseek_v3")
class DeepSeekParser(SectionParser):
    """Both forms DeepSeek's templates write, any number of calls in one section:

        V3:    <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>python
               ```json
               {"code": "print(1)"}
               ```<｜tool▁call▁end｜><｜tool▁calls▁end｜>
        V3.1:  <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>python<｜tool▁sep｜>{"code": "print(1)"}<｜tool▁call▁end｜><｜tool▁calls▁end｜>

    (SGLang's deepseekv3 and deepseekv31 detectors read the same two.) The part before the
    separator is the call's type (`function`, V3: the name and a fenced JSON block follow) or the
    name (V3.1: the JSON arguments follow)."""

    section = ("<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>")
    call = ("<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>")

    def _read(self, body, index, tools):
        head, sep, rest = body.partition(SEP)
        if not sep:
            msg = f"tool call must be NAME{SEP}ARGUMENTS"
            return None, ParseError(ParseErrorKind.NOT_A_CALL, msg, body)
        v3 = _V3_BODY.match(rest) if head.strip() == "function" else None
        name, raw = (v3.group(1), v3.group(2)) if v3 else (head.strip(), rest)
        return named_call(name, raw, body, index, tools)
