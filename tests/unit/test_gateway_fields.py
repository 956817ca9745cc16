"""Request fields past messages, tools and sampling (agentrl/gateway/wire.py): each is honored,
refused with a 400 naming it, or ignored on purpose because it changes nothing the model reads
or samples. A field the gateway cannot honor was accepted and ignored: the agent was answered
as if it had been."""

from __future__ import annotations

import asyncio

import pytest
from gateway_post import CannedEngine, post_once
from transformers import AutoTokenizer

from agentrl.assets.build import resolve_builtin
from agentrl.gateway import Gateway, WireError
from agentrl.gateway.responses import parse_responses_request
from agentrl.gateway.server import GenerationDefaults
from agentrl.gateway.wire import parse_request
from agentrl.parsers import get_parser

USER = {"role": "user", "content": "hi"}


@pytest.fixture(scope="module")
def tok():
    return AutoTokenizer.from_pretrained(resolve_builtin("tiny"))


@pytest.mark.parametrize(
    ("field", "value", "says"),
    [("modalities", ["text", "audio"], "no audio"), ("audio", {"voice": "alloy"}, "audio"),
     ("web_search_options", {}, "web search"), ("function_call", {"name": "add"}, "legacy"),
     ("logit_bias", {"50256": -100}, "logit_bias")],
)  # fmt: skip
def test_fields_the_gateway_cannot_honor_are_400s_naming_them(field, value, says):
    """modalities with audio, audio, web_search_options and a named legacy function_call were
    accepted and ignored: the agent asked for audio, a web search or a forced call and was
    answered plain text as if it had them."""
    with pytest.raises(WireError) as e:
        parse_request({"messages": [USER], field: value})
    assert e.value.status == 400 and says in e.value.message
    assert e.value.body()["error"]["param"] == field


def test_fields_that_ask_for_nothing_are_accepted():
    """What SDKs send when they send every field: an empty logit_bias ({} was a 400), text
    modalities, function_call auto, and the fields ignored on purpose."""
    req = parse_request({
        "messages": [USER], "logit_bias": {}, "modalities": ["text"], "function_call": "auto",
        "functions": [], "response_format": {"type": "text"}, "parallel_tool_calls": False,
        "prediction": {"type": "content", "content": "x"}, "service_tier": "auto",
        "store": False, "metadata": {"k": "v"}, "user": "u", "prompt_cache_key": "k",
    })  # fmt: skip
    assert req.template == {} and req.messages[0].content == "hi"


@pytest.mark.parametrize(
    ("body", "param"),
    [({"reasoning_effort": "low"}, "reasoning_effort"),
     ({"chat_template_kwargs": {"enable_thinking": False}}, "chat_template_kwargs")],
)  # fmt: skip
def test_a_template_variable_other_than_the_runs_is_refused(tok, body, param):
    """reasoning_effort and chat_template_kwargs were ignored: the agent asked for no thinking
    (or low effort) and the model read the run's template, thinking. Every request renders with
    rollout.template_kwargs, so one asking for another is a 400; one asking for the run's is
    served."""
    engine = CannedEngine(tok)
    ep, r = asyncio.run(post_once(Gateway(engine, tok, get_parser("hermes")),
                                  {"messages": [USER], **body}))  # fmt: skip
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == param and "rollout.template_kwargs" in error["message"]
    assert engine.prompts == [] and ep.requests == 0
    ((key, value),) = parse_request({"messages": [USER], **body}).template.items()
    same = GenerationDefaults(template_kwargs={key: value})
    gw = Gateway(engine, tok, get_parser("hermes"), defaults=same)
    _, r = asyncio.run(post_once(gw, {"messages": [USER], **body}))
    assert r.status_code == 200, r.text


def test_a_responses_reasoning_effort_other_than_the_runs_is_refused(tok):
    gw = Gateway(CannedEngine(tok), tok, get_parser("hermes"))
    ep = gw.open("t", 0, "s")
    req = parse_responses_request({"input": "hi", "reasoning": {"effort": "high"}})
    with pytest.raises(WireError) as e:
        asyncio.run(gw.complete(ep, req))
    assert e.value.param == "reasoning_effort" and ep.requests == 0


def test_a_background_response_is_refused_naming_the_field(tok):
    """`background: true` was answered in the foreground: an SDK that then polls
    GET /v1/responses/{id} found no such response. The gateway stores none, so it is a 400
    naming `background`, before anything is sampled; background false is the plain request."""
    import httpx

    async def go(background):
        engine = CannedEngine(tok)
        gw = Gateway(engine, tok, get_parser("hermes"))
        url = await gw.start()
        ep = gw.open("t", 0, "s")
        try:
            async with httpx.AsyncClient() as http:
                r = await http.post(f"{url}/responses", json={"input": "hi",
                                                              "background": background},
                                    headers={"Authorization": f"Bearer {ep.key}"})  # fmt: skip
        finally:
            await gw.aclose()
        return r, engine

    r, engine = asyncio.run(go(True))
    assert r.status_code == 400 and engine.calls == []
    error = r.json()["error"]
    assert error["param"] == "background" and "stores no responses" in error["message"]
    r, _ = asyncio.run(go(False))
    assert r.status_code == 200 and r.json()["status"] == "completed"
