"""gpt-oss (OpenAI's harmony format): one sampled turn is several messages, each on a channel;
a tool call is a message addressed `to=functions.NAME` whose body is the JSON arguments."""

from __future__ import annotations

import re

from agentrl.parsers.base import (
    ParseError,
    ParseErrorKind,
    Parser,
    ParseResult,
    named_call,
    register,
)
from agentrl.types import ToolCall

_START, _MESSAGE = "<|start|>", "<|message|>"
_ENDS = ("<|end|>", "<|call|>", "<|return|>")
_RECIPIENT = re.compile(r"\bto=([^\s<]+)")
_CHANNEL = re.compile(r"<\|channel\|>\s*([A-Za-z_]+)")


@register("harmony")
class HarmonyParser(Parser):
    """The turn after the `<|start|>assistant` prompt, as gpt-oss samples it:

        <|channel|>analysis<|message|>I should run it.<|end|>
        <|start|>assistant<|channel|>commentary to=functions.python <|constrain|>json<|message|>{"code": "print(1)"}

    (the stop tag, `<|call|>` or `<|return|>`, already taken off). Each message is a header up to
    `<|message|>`, then its body up to `<|end|>`. A header naming a recipient (`to=…`, before or
    after the channel, as gpt-oss writes either) is a tool call: `functions.NAME` calls the tool
    NAME, the body is its JSON arguments. The `analysis` channel is the turn's reasoning
    (`ParseResult.reasoning`); `final` and recipient-less `commentary` bodies are its content.
    A header without `<|message|>` is a call cut short (truncated) or malformed; a body that is
    not a JSON object is the model's bad call, read back to it, as SGLang's gpt-oss detector
    reads the same recipients and bodies."""

    def parse(self, text, tools=None, truncated=False) -> ParseResult:
        content: list[str] = []
        reasoning: list[str] = []
        calls: list[ToolCall] = []
        errors: list[ParseError] = []
        chunks = text.split(_START)
        for n, chunk in enumerate(chunks):
            if n > 0:  # `<|start|>assistant…`: the role, then the header
                chunk = chunk[len("assistant") :] if chunk.startswith("assistant") else chunk
            header, sep, body = chunk.partition(_MESSAGE)
            body = _body(body)
            to = _RECIPIENT.search(header)
            if to is None:
                if not sep:  # text outside any message (a model that left the format)
                    content.append(header)
                    continue
                channel = _CHANNEL.search(header)
                into = reasoning if channel and channel.group(1) == "analysis" else content
                into.append(body)
                continue
            index = len(calls) + len(errors)
            name = to.group(1).removeprefix("functions.")
            if not sep:
                last = n == len(chunks) - 1
                kind = ParseErrorKind.TRUNCATED if truncated and last else ParseErrorKind.NOT_A_CALL
                msg = f"tool call to {to.group(1)!r} has no <|message|> with its JSON arguments"
                errors.append(ParseError(kind, msg, chunk, name))
                continue
            call, err = named_call(
                name, body, body, index, tools, truncated and n == len(chunks) - 1
            )
            if call is not None:
                calls.append(call)
            if err is not None:
                errors.append(err)
        said = "\n".join(c.strip() for c in content if c.strip())
        thought = "\n".join(r.strip() for r in reasoning if r.strip())
        return ParseResult(said, calls, errors, reasoning=thought or None)


def _body(body: str) -> str:
    """A message's body without the tag that ends it."""
    for end in _ENDS:
        at = body.find(end)
        if at >= 0:
            body = body[:at]
    return body
