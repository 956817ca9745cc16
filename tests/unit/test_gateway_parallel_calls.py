"""`parallel_tool_calls: false` (agentrl/gateway/stop.py: cut_to_one_call): the answer holds one
tool call at most, as OpenAI's, and the recorded turn is exactly the sampled ids up to the end of
that call, so what is trained is what the agent was answered and echoes back."""

from __future__ import annotations

import asyncio
import json

import pytest
from gateway_post import CannedEngine, post_once
from transformers import AutoTokenizer

from agentrl.assets.build import resolve_builtin
from agentrl.gateway import Gateway
from agentrl.gateway.responses import parse_responses_request
from agentrl.gateway.wire import WireError, message_body, parse_request
from agentrl.parsers import get_parser
from agentrl.types import FinishReason

TOOLS = [{"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}]
USER = {"role": "user", "content": "What is 1 + 2 and 3 + 4?"}
CALL = '<tool_call>\n{{"name": "add", "arguments": {{"a": {}, "b": {}}}}}\n</tool_call>'
TWO = CALL.format(1, 2) + "\n" + CALL.format(3, 4) + "\nBoth added.<|im_end|>"


@pytest.fixture(scope="module")
def tok():
    return AutoTokenizer.from_pretrained(resolve_builtin("tiny"))


def test_one_call_is_answered_and_the_turn_ends_after_it(tok):
    """Before: both calls were answered (and trained) under parallel_tool_calls false."""
    engine = CannedEngine(tok, TWO, width=2)
    gw = Gateway(engine, tok, get_parser("hermes"))
    body = {"messages": [USER], "tools": TOOLS, "parallel_tool_calls": False}
    ep, r = asyncio.run(post_once(gw, body))
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    calls = choice["message"]["tool_calls"]
    assert len(calls) == 1 and json.loads(calls[0]["function"]["arguments"]) == {"a": 1, "b": 2}
    assert choice["finish_reason"] == "tool_calls" and not choice["message"]["content"]
    (cap,) = ep.trained()
    (turn,) = cap.seq.turns
    kept = cap.seq.ids[turn.start : turn.end]
    assert kept == engine.ids[: len(kept)]  # a prefix of the sampled ids, as sampled
    assert tok.decode(kept) == CALL.format(1, 2)  # ends at the first call's closing tag
    assert cap.seq.logprobs[turn.start : turn.end] == [-0.5] * len(kept)
    assert turn.finish_reason is FinishReason.STOP and turn.num_tool_calls == 1
    assert cap.seq.routes.shape == (len(cap.seq.ids) - 1, 2)  # routes cut with the ids
    assert r.json()["usage"]["completion_tokens"] == len(kept)


def test_the_echoed_single_call_extends_the_cut_turn(tok):
    """The agent's next request echoes the one call: it extends the recorded sequence (no fork:
    the recorded turn is what the agent was shown), the end of turn supplied, masked."""
    engine = CannedEngine(tok, TWO)
    gw = Gateway(engine, tok, get_parser("hermes"))
    ep = gw.open("t", 0, "s")
    body = {"messages": [USER], "tools": TOOLS, "parallel_tool_calls": False}
    (choice,), _ = asyncio.run(gw.complete(ep, parse_request(body)))
    said = message_body(choice.message)
    result = {"role": "tool", "tool_call_id": said["tool_calls"][0]["id"], "content": "3"}
    body["messages"] = [USER, said, result]
    asyncio.run(gw.complete(ep, parse_request(body)))
    assert ep.counts["extend"] == 1 and ep.counts.get("fork", 0) == 0
    (cap,) = ep.trained()
    first, _ = cap.seq.turns
    obs = tok.decode(cap.seq.ids[first.end : first.obs_end])
    assert obs.startswith("<|im_end|>") and "<tool_response>" in obs
    assert set(cap.seq.mask[first.end : first.obs_end]) == {0}


def test_parallel_calls_stay_whole_when_allowed_and_one_call_is_never_cut(tok):
    for flag in (True, None):
        body = {"messages": [USER], "tools": TOOLS, "parallel_tool_calls": flag}
        _, r = asyncio.run(post_once(Gateway(CannedEngine(tok, TWO), tok, get_parser("hermes")),
                                     body))  # fmt: skip
        assert len(r.json()["choices"][0]["message"]["tool_calls"]) == 2
    one = CALL.format(1, 2) + "\nDone.<|im_end|>"
    engine = CannedEngine(tok, one)
    body = {"messages": [USER], "tools": TOOLS, "parallel_tool_calls": False}
    ep, r = asyncio.run(post_once(Gateway(engine, tok, get_parser("hermes")), body))
    (cap,) = ep.trained()
    assert cap.seq.ids[cap.seq.turns[0].start :] == engine.ids  # uncut
    assert r.json()["choices"][0]["message"]["content"] == "Done."


def test_the_responses_api_answers_one_function_call_and_echoes_the_flag(tok):
    async def go():
        gw = Gateway(CannedEngine(tok, TWO), tok, get_parser("hermes"))
        url = await gw.start()
        ep = gw.open("t", 0, "s")
        try:
            import httpx

            async with httpx.AsyncClient() as http:
                body = {"input": USER["content"], "parallel_tool_calls": False,
                        "tools": [{"type": "function", "name": "add"}]}  # fmt: skip
                return await http.post(f"{url}/responses", json=body,
                                       headers={"Authorization": f"Bearer {ep.key}"})  # fmt: skip
        finally:
            await gw.aclose()

    out = asyncio.run(go()).json()
    assert out["parallel_tool_calls"] is False
    assert [o["type"] for o in out["output"]] == ["function_call"]


def test_a_flag_that_is_not_a_boolean_is_refused():
    for parse, body in ((parse_request, {"messages": [USER]}), (parse_responses_request,
                                                                   {"input": "x"})):  # fmt: skip
        with pytest.raises(WireError, match="`parallel_tool_calls` must be true or false") as e:
            parse({**body, "parallel_tool_calls": "false"})
        assert e.value.param == "parallel_tool_calls"


def test_an_id_that_completes_two_calls_is_a_loud_failure_never_two_calls(tok):
    """No cut keeps one call when one id completes two (a toy format: each `e` or `l` a call,
    and "el" one id): the request is a 500 naming the flag, nothing is recorded, the episode is
    the system's failure (not answered with two calls, not trained on what was not answered)."""
    from agentrl.parsers import Parser
    from agentrl.parsers.base import ParseResult
    from agentrl.types import StopReason, ToolCall

    class Letters(Parser):
        def parse(self, text, tools=None, truncated=False):
            calls = [ToolCall(id=f"call_{i}", name="add", arguments={})
                     for i, ch in enumerate(text) if ch in "el"]  # fmt: skip
            return ParseResult(text, calls)

    engine = CannedEngine(tok, "xel<|im_end|>")
    assert [tok.decode([i]) for i in engine.ids[:2]] == ["x", "el"]
    body = {"messages": [USER], "tools": TOOLS, "parallel_tool_calls": False}
    ep, r = asyncio.run(post_once(Gateway(engine, tok, Letters()), body))
    assert r.status_code == 500 and r.json()["error"]["code"] == "tool_call_cut", r.text
    assert r.json()["error"]["param"] == "parallel_tool_calls"
    assert ep.stop is StopReason.ABORTED and ep.trained() == []


def test_a_call_drafted_while_thinking_is_not_the_one_kept(tok):
    """A thinking model whose prompt opened the <think> (the turn holds only its close): a
    prefix ending inside the reasoning read a call drafted there as the turn's first call, and
    the answer was cut mid-thought with that draft as its call. The cut is after the first call
    of the answer proper, the reasoning whole."""
    draft = "Maybe " + CALL.format(9, 9) + " then check it." * 40 + "</think>\n"
    engine = CannedEngine(tok, draft + TWO)
    body = {"messages": [USER], "tools": TOOLS, "parallel_tool_calls": False}
    ep, r = asyncio.run(post_once(Gateway(engine, tok, get_parser("hermes")), body))
    message = r.json()["choices"][0]["message"]
    (call,) = message["tool_calls"]
    assert json.loads(call["function"]["arguments"]) == {"a": 1, "b": 2}
    assert message["reasoning_content"] == draft.removesuffix("</think>\n").strip()
    (cap,) = ep.trained()
    assert tok.decode(cap.seq.ids[cap.seq.turns[0].start :]) == draft + CALL.format(1, 2)
