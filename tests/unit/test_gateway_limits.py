"""Requests too big for the context, refused before the work they would cost in the event loop
every episode shares (agentrl/gateway/limits.py), and a request's `n` samples rendered once: a
red-team pass found 1.8 MB of empty messages held the gateway's loop 3.2 s (every other episode's
requests waiting) before their context_length_exceeded."""

from __future__ import annotations

import asyncio

import pytest
from gateway_post import CannedEngine, post_once
from transformers import AutoTokenizer

from agentrl.assets.build import resolve_builtin
from agentrl.gateway import Gateway, GenerationDefaults
from agentrl.gateway.wire import parse_request
from agentrl.parsers import get_parser
from agentrl.render import Renderer
from agentrl.types import Message, StopReason, ToolCall

USER = {"role": "user", "content": "hi"}


@pytest.fixture(scope="module")
def tok():
    return AutoTokenizer.from_pretrained(resolve_builtin("tiny"))


@pytest.fixture
def work(monkeypatch):
    """What the gateway did: requests parsed, template renders, text counted (tokens_past)."""
    import agentrl.gateway.server as server

    done = {"parsed": 0, "rendered": 0, "counted": 0}

    def counting(name, real):
        def wrapper(*a, **k):
            done[name] += 1
            return real(*a, **k)

        return wrapper

    monkeypatch.setattr(server, "parse_request", counting("parsed", server.parse_request))
    monkeypatch.setattr(server, "parse_responses_request",
                        counting("parsed", server.parse_responses_request))  # fmt: skip
    monkeypatch.setattr(Renderer, "render", counting("rendered", Renderer.render))
    monkeypatch.setattr(Renderer, "encode_text", counting("counted", Renderer.encode_text))
    return done


def refused(tok, body, route="chat/completions", context=32768):
    gw = Gateway(CannedEngine(tok), tok, get_parser("hermes"),
                 defaults=GenerationDefaults(max_context_tokens=context))  # fmt: skip
    ep, r = asyncio.run(post_once(gw, body, route))
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["code"] == "context_length_exceeded", error
    assert ep.stop is StopReason.CONTEXT_OVERFLOW and ep.counts["bad_requests"] == 1
    assert gw.engine.calls == []
    return error["message"]


def test_many_empty_messages_are_refused_before_they_are_parsed_or_rendered(tok, work):
    """100k `{"role":"user"}` (1.6 MB, under the 2 MB body limit at 32k tokens) were parsed and
    rendered to 500k prompt ids before the prompt's length refused them: 3.2 s of the event loop.
    More messages than the context has tokens cannot fit (each is at least one token)."""
    said = refused(tok, {"messages": [{"role": "user"}] * 100_000})
    assert "100000 messages" in said and "rollout.max_context_tokens=32768" in said
    assert work == {"parsed": 0, "rendered": 0, "counted": 0}


def test_many_input_items_are_refused_before_they_are_parsed_or_rendered(tok, work):
    """The Responses API route: the same, over `input` items (reasoning items render nothing
    and are not counted; function calls are)."""
    items = [{"type": "reasoning", "summary": []}] * 5000 + [{"role": "user", "content": ""}]
    items += [{"type": "function_call", "call_id": "c", "name": "f"}] * 5000 + [USER]
    said = refused(tok, {"input": items, "instructions": "be brief"}, "responses", 2048)
    assert "2049+ messages, tool calls and tools (2 messages, 2047+ tool calls" in said
    assert work == {"parsed": 0, "rendered": 0, "counted": 0}


def test_many_tools_or_tool_calls_are_refused_before_they_are_read(tok, work):
    """10k tools (each a name) were each checked, JSON-dumped and their text tokenized before
    the count passed the context; 10k tool calls in one assistant message each parsed."""
    tools = [{"type": "function", "function": {"name": "f"}}] * 10_000
    said = refused(tok, {"messages": [USER], "tools": tools}, context=2048)
    assert "10001+ messages, tool calls and tools (1 messages, 0+ tool calls, 10000 tools)" in said
    assert work["counted"] == 0  # no text was tokenized
    calls = [{"id": "c", "type": "function", "function": {"name": "f"}}] * 10_000
    said_calls = {"role": "assistant", "content": None, "tool_calls": calls}
    said = refused(tok, {"messages": [USER, said_calls, USER]}, context=2048)
    assert "(3 messages, 10000+ tool calls, 0 tools)" in said
    assert work == {"parsed": 0, "rendered": 0, "counted": 0}


def test_a_request_of_as_many_parts_as_the_context_has_tokens_is_rendered(tok, work):
    """The bound is the context's tokens: at it, the request is rendered and refused by its
    prompt's length (5 ids a message with this template); one more, unrendered."""
    said = refused(tok, {"messages": [USER] * 64}, context=64)
    assert "prompt is 386 tokens" in said and work["parsed"] == 1 and work["rendered"] > 0
    said = refused(tok, {"messages": [USER] * 65}, context=64)
    assert "65 messages" in said and work["parsed"] == 1


class Visits(list):
    """A list that counts the items read by index."""

    visits = 0

    def __getitem__(self, i):
        self.visits += len(range(*i.indices(len(self)))) if isinstance(i, slice) else 1
        return super().__getitem__(i)


def test_input_items_are_read_a_bounded_number_of_times():
    """Each function_call item of a Responses API input looked back for the turn it belongs to
    through a copy of every item before it: 40k calls (2 MB) were 1.4 s of parsing, quadratic."""
    from agentrl.gateway.responses import parse_responses_request

    items = Visits([{"role": "user", "content": "hi"}, {"type": "reasoning"}])
    items += [{"type": "function_call", "call_id": f"c{i}", "name": "f"} for i in range(2000)]
    items += [{"type": "function_call_output", "call_id": "c0", "output": "1"}]
    req = parse_responses_request({"input": items})
    assert [m.role for m in req.messages] == ["user", "assistant", "tool"]
    assert len(req.messages[1].tool_calls) == 2000 and items.visits <= 2 * len(items)


def test_a_requests_samples_are_rendered_once(tok, monkeypatch):
    """n=16 rendered the request's history 16 times, once a sample (6,000 messages: 4 s of the
    event loop); the samples read the same ids, placed as before: the first request's all
    start, a later one extends one sequence and branches the rest from the same turn."""
    made: list[int] = []
    for name in ("prompt_ids", "observation_ids"):
        real = getattr(Renderer, name)
        monkeypatch.setattr(Renderer, name,
                            lambda r, *a, _real=real, **k: made.append(1) or _real(r, *a, **k))  # fmt: skip
    gw = Gateway(CannedEngine(tok), tok, get_parser("hermes"))
    ep = gw.open("t", 0, "s")
    first, _ = asyncio.run(gw.complete(ep, parse_request({"messages": [USER], "n": 4})))
    assert len(made) == 1 and ep.counts["start"] == 4 and len(ep.sequences) == 4
    assert len({tuple(c.seq.ids) for c in ep.sequences}) == 1
    made.clear()
    said = {"role": "assistant", "content": first[2].message.content}
    body = {"messages": [USER, said, {"role": "user", "content": "and?"}], "n": 3}
    asyncio.run(gw.complete(ep, parse_request(body)))
    assert len(made) == 1 and ep.counts["extend"] == 1 and ep.counts["branch"] == 2
    grown = max((c.seq.ids for c in ep.sequences[:4]), key=len)  # the one extended
    for cap in ep.sequences[4:]:
        assert cap.seq.ids[: cap.seq.prompt_len] == grown[: cap.seq.prompt_len]


def test_every_family_writes_a_token_for_each_message_call_and_tool():
    """The bound's premise, for each chat template agentrl is checked against: a message, a
    tool call (with its result) and a tool are each at least one token, even empty. The
    exceptions the bound counts anyway (agentrl/gateway/limits.py): system messages
    (DeepSeek joins them, gpt-oss keeps the first) and DeepSeek-V3's tools (left out)."""
    pytest.importorskip("trl")
    from agentrl.assets.families import FAMILIES, family_tokenizer

    k, user = 20, Message(role="user", content="x")
    empty = [Message(role="user", content=""), Message(role="assistant", content="")] * k
    rounds = []
    for i in range(k):
        call = ToolCall(id=f"c{i}", name="f", arguments={})
        rounds += [Message(role="assistant", content="", tool_calls=[call]),
                   Message(role="tool", content="", tool_call_id=f"c{i}", name="f")]  # fmt: skip
    tools = [{"type": "function", "function": {"name": f"t{i}", "description": "",
              "parameters": {"type": "object", "properties": {}}}} for i in range(k)]  # fmt: skip
    for key, fam in FAMILIES.items():
        tok = family_tokenizer(key)
        r = Renderer(tok, None, fam.template_kwargs)
        base = len(r.prompt_ids([user]))
        assert len(r.prompt_ids(empty + [user])) - base >= 2 * k, key
        assert len(r.prompt_ids([user, *rounds, user])) - base >= 3 * k, key  # 2 messages, 1 call
        if key != "deepseekv3":
            with_tools = len(Renderer(tok, tools, fam.template_kwargs).prompt_ids([user]))
            assert with_tools - base >= k, key
