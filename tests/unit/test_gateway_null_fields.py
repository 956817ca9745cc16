"""Fields a client sends as null, as SDKs that serialize every field do: a null is the field left
out. Found by a red-team pass: `max_completion_tokens: null` beside `max_tokens: 5` read as no
limit at all, and the agent's cap was silently dropped (the run's max_new_tokens sampled)."""

from __future__ import annotations

from agentrl.gateway.wire import parse_request

USER = {"role": "user", "content": "hi"}


def test_a_null_max_completion_tokens_leaves_max_tokens_in_force():
    body = {"messages": [USER], "max_tokens": 5, "max_completion_tokens": None}
    assert parse_request(body).max_tokens == 5
    body = {"messages": [USER], "max_tokens": None, "max_completion_tokens": 7}
    assert parse_request(body).max_tokens == 7
    assert parse_request({"messages": [USER], "max_tokens": None}).max_tokens is None
