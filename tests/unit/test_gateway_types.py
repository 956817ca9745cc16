"""A red-team pass over the gateway's request readers (agentrl/gateway/wire.py, responses.py):
fields of the wrong JSON type are 400s naming the field, never a 500 (which SDKs retry, and no
bad request of the episode counted) nor text rendered into the prompt that the agent never
sent."""

from __future__ import annotations

import pytest

from agentrl.gateway.responses import parse_responses_request
from agentrl.gateway.wire import WireError, parse_request

USER = {"role": "user", "content": "hi"}


@pytest.mark.parametrize(
    ("body", "says"),
    [
        # an unhashable role was a TypeError: a 500
        ({"messages": [{"role": ["user"], "content": "x"}]}, "role must be one of"),
        ({"messages": [{"role": {"a": 1}, "content": "x"}]}, "role must be one of"),
        # a text part whose text is an object was rendered as "{'a': 1}"
        ({"messages": [{"role": "user", "content": [{"type": "text", "text": {"a": 1}}]}]},
         "`text` must be a string"),
        # parameters that are no schema were rendered into the tools' prompt as they came
        ({"messages": [USER], "tools": [{"type": "function",
                                         "function": {"name": "a", "parameters": "x"}}]},
         "tools[0]: a tool's parameters must be a JSON schema object"),
        ({"messages": [USER], "tools": [{"type": "function",
                                         "function": {"name": "a", "description": {"x": 1}}}]},
         "description must be a string"),
    ],
)  # fmt: skip
def test_chat_fields_of_the_wrong_type_are_400s(body, says):
    with pytest.raises(WireError) as e:
        parse_request(body)
    assert e.value.status == 400 and says in e.value.message


@pytest.mark.parametrize(
    ("body", "says"),
    [
        ({"input": [{"role": ["user"], "content": "x"}]}, "role must be user"),
        ({"input": [{"type": "message", "role": {"a": 1}, "content": "x"}]}, "role must be user"),
        ({"input": [{"role": "user", "content": [{"type": "input_text", "text": 5}]}]},
         "`text` must be a string"),
        ({"input": "x", "tools": [{"type": "function", "name": "a", "parameters": 5}]},
         "parameters must be a JSON schema object"),
        # a string was not read as a list: the logprobs it asked for were answered without them
        ({"input": "x", "include": "message.output_text.logprobs"}, "`include` must be a list"),
    ],
)  # fmt: skip
def test_responses_fields_of_the_wrong_type_are_400s(body, says):
    with pytest.raises(WireError) as e:
        parse_responses_request(body)
    assert e.value.status == 400 and says in e.value.message
