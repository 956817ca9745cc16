"""A tool call whose arguments hold NaN or Infinity, which Python's json reads but JSON has
not. Found by a red-team pass: the gateway answered `"arguments": "{\"a\": NaN}"` (no JSON
parser outside Python reads it; OpenAI never sends it), and the agent's echo of that call never
matched the one answered (NaN != NaN), so its next request forked the episode. Such a call is
now the model's bad JSON, as any other."""

from __future__ import annotations

from agentrl.parsers import get_parser
from agentrl.parsers.base import ParseErrorKind


def test_non_finite_numbers_in_a_calls_arguments_are_bad_json():
    parser = get_parser("hermes")
    for literal in ("NaN", "Infinity", "-Infinity"):
        text = f'<tool_call>\n{{"name": "add", "arguments": {{"a": {literal}}}}}\n</tool_call>'
        said = parser.parse_turn(text)
        assert not said.tool_calls, literal
        assert [e.kind for e in said.errors] == [ParseErrorKind.BAD_JSON], said.errors
    said = parser.parse_turn('<tool_call>\n{"name": "add", "arguments": {"a": 1e3}}\n</tool_call>')
    assert said.tool_calls[0].arguments == {"a": 1000.0}  # a finite number is read as before
