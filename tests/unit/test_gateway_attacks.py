"""Red-team attacks on the gateway (agentrl/gateway/) as a hostile or unusual agent sends them,
against a canned engine on the shipped tiny model's tokenizer: each answer is what OpenAI's
would be, and what is recorded is exactly what the model read and sampled."""

from __future__ import annotations

import asyncio

import pytest
from gateway_post import CannedEngine, post_once
from transformers import AutoTokenizer

from agentrl.assets.build import resolve_builtin
from agentrl.gateway import Gateway
from agentrl.parsers import get_parser
from agentrl.types import Completion, FinishReason


@pytest.fixture(scope="module")
def tok():
    return AutoTokenizer.from_pretrained(resolve_builtin("tiny"))


def test_a_stop_string_cuts_the_routes_with_the_ids(tok):
    """A stop string cut the sampled ids but kept the routes of every sampled position: under
    learner.routing_replay the turn was a 500 (or, where the sizes divided, routes of another
    width, replayed on the wrong tokens). The routes now end with the ids kept."""
    engine = CannedEngine(tok, "Hello world. More text here<|im_end|>", width=4)
    body = {"messages": [{"role": "user", "content": "hi"}], "stop": ["world"]}
    ep, r = asyncio.run(post_once(Gateway(engine, tok, get_parser("hermes")), body))
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["message"]["content"] == "Hello "
    (cap,) = ep.trained()
    ids, routes = cap.seq.ids, cap.seq.routes
    assert len(ids) < len(engine.calls[0][0]) + len(engine.ids)  # cut
    assert routes.shape == (len(ids) - 1, 4)
    assert routes.ravel().tolist() == list(range((len(ids) - 1) * 4))  # the kept positions'


class Held:
    """An engine whose answers wait for `release`; `finished` is set when one ends, sampled or
    cancelled."""

    def __init__(self, tok) -> None:
        self.ids = tok.encode("four<|im_end|>", add_special_tokens=False)
        self.release, self.finished = asyncio.Event(), asyncio.Event()

    async def generate(self, input_ids, params, key=None):
        try:
            await self.release.wait()
            ids = self.ids[: params.max_new_tokens]
            return Completion(ids, [-0.5] * len(ids), FinishReason.STOP)
        finally:
            self.finished.set()


def test_a_request_whose_later_sample_is_refused_records_none_of_its_samples(tok):
    """n=2 with room in the episode's max_sampled_tokens for one answer: the second sample's
    400 went to the agent while the first went on sampling, and its turn was trained as the
    episode's last answer, one the agent never got. The request is now all or nothing."""
    from agentrl.gateway import GatewayConfig
    from agentrl.gateway.server import GenerationDefaults

    async def go():
        engine = Held(tok)
        gw = Gateway(engine, tok, get_parser("hermes"), GatewayConfig(max_sampled_tokens=40),
                     GenerationDefaults(max_new_tokens=40))  # fmt: skip
        body = {"messages": [{"role": "user", "content": "hi"}], "n": 2}
        ep, r = await post_once(gw, body)
        engine.release.set()
        await engine.finished.wait()  # the first sample's end, whichever it was
        return ep, r

    ep, r = asyncio.run(go())
    assert r.status_code == 400 and r.json()["error"]["code"] == "episode_budget_exceeded"
    assert ep.trained() == [] and ep.sampled_tokens == 0 and ep.reserved == 0


def test_a_stop_string_the_last_sampled_id_completes_ends_the_answer_as_stop(tok):
    """max_tokens ran out on the very token that completed a stop string: OpenAI answers
    finish_reason stop; the gateway answered `length` and recorded the turn as cut (the episode's
    truncation: rollout.truncated's penalty or mask on an answer that ended where it should)."""
    engine = CannedEngine(tok, "Hello world")

    async def length_cut(input_ids, params, key=None):
        comp = await CannedEngine.generate(engine, input_ids, params, key)
        comp.finish_reason = FinishReason.LENGTH
        return comp

    engine.generate = length_cut
    body = {"messages": [{"role": "user", "content": "hi"}], "stop": ["world"]}
    ep, r = asyncio.run(post_once(Gateway(engine, tok, get_parser("hermes")), body))
    choice = r.json()["choices"][0]
    assert choice["finish_reason"] == "stop" and choice["message"]["content"] == "Hello "
    (cap,) = ep.trained()
    assert cap.seq.turns[0].finish_reason is FinishReason.STOP
    assert cap.seq.ids[cap.seq.turns[0].start :] == engine.ids  # nothing was cut


def test_tools_far_past_the_context_are_refused_before_they_are_rendered(tok, monkeypatch):
    """The messages' text is counted before it is tokenized whole; the tools' was not: 900 KB of
    one-character tokens in a tool's description (under the body limit) held the event loop every
    episode shares for 1.6 s (the tools' renderer built, the prompt tokenized) before the
    context_length_exceeded. The tools are now counted with the messages, first."""
    from agentrl.gateway.limits import COUNT_CHUNK_CHARS
    from agentrl.gateway.server import GenerationDefaults
    from agentrl.render import Renderer
    from agentrl.types import StopReason

    counted: list[int] = []
    real = Renderer.encode_text
    monkeypatch.setattr(Renderer, "encode_text", lambda r, t: counted.append(len(t)) or real(r, t))
    tools = [{"type": "function", "function": {"name": "add", "description": "a b " * 225_000}}]
    gw = Gateway(None, tok, get_parser("hermes"),
                 defaults=GenerationDefaults(max_context_tokens=2048))  # fmt: skip
    body = {"messages": [{"role": "user", "content": "hi"}], "tools": tools}
    ep, r = asyncio.run(post_once(gw, body))
    assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded"
    assert ep.stop is StopReason.CONTEXT_OVERFLOW
    assert sum(counted) <= 2 * COUNT_CHUNK_CHARS
    assert list(gw._renderers) == ["[]"]  # none was built for the tools


def test_a_request_read_after_its_episode_closed_samples_nothing(tok):
    """The key is checked before the body is read; an episode that closed while a (large, slow)
    body came in still had its request sampled to the end on the engine, then thrown away."""
    from agentrl.gateway import WireError
    from agentrl.gateway.wire import parse_request

    engine = CannedEngine(tok, "four<|im_end|>")
    gw = Gateway(engine, tok, get_parser("hermes"))
    ep = gw.open("t", 0, "s")
    gw.close(ep)
    req = parse_request({"messages": [{"role": "user", "content": "hi"}]})
    with pytest.raises(WireError) as e:
        asyncio.run(gw.complete(ep, req))
    assert e.value.status == 401 and engine.calls == [] and ep.sequences == []


def test_a_stop_string_ending_in_a_multibyte_character_keeps_that_character_whole(tok):
    """A stop string whose last character takes several byte-level ids: the cut was found by
    the decoded text's length, which the ids reaching into that character already have (a
    U+FFFD stands for it), so the answer ended mid-character: the agent read "a\ufffd" and
    the turn was trained without the stop string it was cut for. It ends after the character."""
    engine = CannedEngine(tok, "a😀b<|im_end|>")
    body = {"messages": [{"role": "user", "content": "hi"}], "stop": ["😀"]}
    ep, r = asyncio.run(post_once(Gateway(engine, tok, get_parser("hermes")), body))
    choice = r.json()["choices"][0]
    assert choice["message"]["content"] == "a" and choice["finish_reason"] == "stop"
    (cap,) = ep.trained()
    sampled = cap.seq.ids[cap.seq.turns[0].start :]
    assert tok.decode(sampled) == "a😀" and sampled == engine.ids[: len(sampled)]
