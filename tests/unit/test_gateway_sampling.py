"""A request's sampling settings past temperature/top_p (agentrl/gateway/sampling.py): under
rollout.gateway.sampling=run (training) one that would change the distribution sampled is a 400
naming it, never accepted and ignored; under sampling=request each reaches the engine."""

from __future__ import annotations

import asyncio

import pytest
from gateway_post import CannedEngine, post_once
from transformers import AutoTokenizer

from agentrl.assets.build import resolve_builtin
from agentrl.gateway import Gateway, GatewayConfig
from agentrl.gateway.responses import parse_responses_request
from agentrl.parsers import get_parser

USER = {"role": "user", "content": "hi"}


@pytest.fixture(scope="module")
def tok():
    return AutoTokenizer.from_pretrained(resolve_builtin("tiny"))


@pytest.mark.parametrize(
    ("field", "value"),
    [("presence_penalty", 0.5), ("frequency_penalty", -0.3), ("repetition_penalty", 1.1),
     ("top_k", 5), ("min_p", 0.05)],
)  # fmt: skip
def test_a_setting_that_changes_the_distribution_is_refused_in_training(tok, field, value):
    """presence_penalty/frequency_penalty were accepted and ignored: the agent asked for one
    distribution and was answered (and trained) from another. Under sampling=run each such
    setting is now a 400 that names it and rollout.gateway.sampling; nothing is sampled."""
    engine = CannedEngine(tok)
    gw = Gateway(engine, tok, get_parser("hermes"))
    ep, r = asyncio.run(post_once(gw, {"messages": [USER], field: value}))
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["code"] == "unsupported_parameter" and error["param"] == field
    assert field in error["message"] and "rollout.gateway.sampling" in error["message"]
    assert engine.params == [] and ep.requests == 0 and ep.counts["bad_requests"] == 1


def test_neutral_settings_and_a_seed_are_served_with_the_runs_sampling(tok):
    """Neutral values (what SDKs send when they send every field) change nothing and are
    served; a seed is the run's (a fixed agent seed would give a group one answer)."""
    engine = CannedEngine(tok)
    body = {"messages": [USER], "presence_penalty": 0, "frequency_penalty": 0.0,
            "repetition_penalty": 1, "top_k": -1, "min_p": 0, "seed": 7}  # fmt: skip
    _, r = asyncio.run(post_once(Gateway(engine, tok, get_parser("hermes")), body))
    assert r.status_code == 200, r.text
    (p,) = engine.params
    assert (p.presence_penalty, p.frequency_penalty, p.repetition_penalty) == (0, 0, 1)
    assert (p.top_k, p.min_p, p.seed) == (-1, 0, None)


def test_under_sampling_request_the_engine_samples_with_the_requests_settings(tok):
    """`agentrl gateway` (rollout.gateway.sampling=request): every setting is honored."""
    engine = CannedEngine(tok)
    gw = Gateway(engine, tok, get_parser("hermes"), GatewayConfig(sampling="request"))
    body = {"messages": [USER], "presence_penalty": 0.5, "frequency_penalty": -0.3,
            "repetition_penalty": 1.1, "top_k": 5, "min_p": 0.05, "seed": 7,
            "temperature": 0.3, "top_p": 0.9}  # fmt: skip
    _, r = asyncio.run(post_once(gw, body))
    assert r.status_code == 200, r.text
    sent = engine.params[0].to_sglang()
    want = {"presence_penalty": 0.5, "frequency_penalty": -0.3, "repetition_penalty": 1.1,
            "top_k": 5, "min_p": 0.05, "sampling_seed": 7, "temperature": 0.3, "top_p": 0.9}  # fmt: skip
    assert {k: sent[k] for k in want} == want


@pytest.mark.parametrize(
    ("body", "says"),
    [({"presence_penalty": 3}, "from -2 to 2"), ({"top_k": 0}, "-1 (off)"),
     ({"repetition_penalty": 0}, "above 0"), ({"seed": 1.5}, "64-bit integer"),
     ({"min_p": float("nan")}, "from 0 to 1")],
)  # fmt: skip
def test_settings_out_of_range_are_refused_on_both_apis(body, says):
    from agentrl.gateway import WireError
    from agentrl.gateway.wire import parse_request

    for parse, base in ((parse_request, {"messages": [USER]}), (parse_responses_request,
                                                                {"input": "hi"})):  # fmt: skip
        with pytest.raises(WireError) as e:
            parse({**base, **body})
        assert e.value.status == 400 and says in e.value.message


def test_a_seeded_request_for_n_samples_gets_n_samples_not_one_n_times(tok):
    """Under sampling=request a request's seed went to each of its `n` samples alike: the
    agent asked for n answers and got one answer n times. Sample i samples with seed + i."""
    engine = CannedEngine(tok)
    gw = Gateway(engine, tok, get_parser("hermes"), GatewayConfig(sampling="request"))
    _, r = asyncio.run(post_once(gw, {"messages": [USER], "seed": 7, "n": 3}))
    assert r.status_code == 200, r.text
    assert sorted(p.seed for p in engine.params) == [7, 8, 9]
