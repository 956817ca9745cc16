"""A request with `n` > 1 (agentrl/gateway/): the episode's latest answer, the one its reward
sees and whose cut is its truncation, is choices[0]'s (agents take it by convention), or the
choice a later request goes on from; never whichever sample the engine ended last."""

from __future__ import annotations

import asyncio

import pytest
from transformers import AutoTokenizer

from agentrl.agent_rollout import episode_trajectories, last_sequence
from agentrl.assets.build import resolve_builtin
from agentrl.gateway import Gateway
from agentrl.gateway.wire import parse_request
from agentrl.parsers import get_parser
from agentrl.types import Completion, FinishReason, StopReason


@pytest.fixture(scope="module")
def tok():
    return AutoTokenizer.from_pretrained(resolve_builtin("tiny"))


class InOrder:
    """The engine's answers, one a call, as (text, finish reason): the first call ends at once,
    the later ones only after it (so choice 0 ends first); None waits until cancelled."""

    def __init__(self, tok, answers: list[tuple[str, FinishReason] | None]) -> None:
        self.tok, self.answers, self.calls = tok, answers, 0
        self.first, self.waiting = asyncio.Event(), asyncio.Event()

    async def generate(self, input_ids, params, key=None):
        k, self.calls = self.calls, self.calls + 1
        await asyncio.sleep(0)  # the request's other samples begin meanwhile
        if k > 0:
            await self.first.wait()
        if self.answers[k] is None:
            self.waiting.set()
            await asyncio.Event().wait()
        text, finish = self.answers[k]
        ids = self.tok.encode(text, add_special_tokens=False)
        self.first.set()
        return Completion(ids, [-0.5] * len(ids), finish)


HI = {"role": "user", "content": "hi"}


def test_the_reward_and_the_stop_reason_follow_choice_0_not_the_sample_that_ended_last(tok):
    """n=2, choice 0 answered whole and first, choice 1 cut and later: the episode's reward was
    given choice 1's sequence and its stop reason was `length`, from an answer the agent (which
    took choices[0]) never went on with."""
    engine = InOrder(
        tok, [("four<|im_end|>", FinishReason.STOP), ("five five", FinishReason.LENGTH)]
    )
    gw = Gateway(engine, tok, get_parser("hermes"))
    ep = gw.open("t", 0, "s")
    choices, _ = asyncio.run(gw.complete(ep, parse_request({"messages": [HI], "n": 2})))
    assert [c.finish for c in choices] == ["stop", "length"]
    trajs = episode_trajectories(ep, StopReason.COMPLETED, None)
    assert len(trajs) == 2 and ep.counts["start"] == 2  # both sampled at once
    last = last_sequence(trajs)
    assert last is trajs[0] and last.metadata["sequence"] == 0
    assert last.turns[-1].assistant.content == choices[0].message.content == "four"
    assert {t.stop_reason for t in trajs} == {StopReason.COMPLETED}


def test_the_choice_a_later_request_goes_on_from_is_the_episodes_latest_answer(tok):
    """n=2, then the agent goes on from choices[1]; the episode ends (the agent raised) while
    that request samples: the latest answer is choice 1's, whole, not choice 0's cut one."""
    answers = [("five five", FinishReason.LENGTH), ("four<|im_end|>", FinishReason.STOP), None]
    engine = InOrder(tok, answers)
    gw = Gateway(engine, tok, get_parser("hermes"))
    ep = gw.open("t", 0, "s")

    async def go():
        choices, _ = await gw.complete(ep, parse_request({"messages": [HI], "n": 2}))
        said = {"role": "assistant", "content": choices[1].message.content}
        body = {"messages": [HI, said, {"role": "user", "content": "and?"}]}
        task = asyncio.ensure_future(gw.complete(ep, parse_request(body)))
        await engine.waiting.wait()
        gw.close(ep)
        with pytest.raises(asyncio.CancelledError):
            await task
        return choices

    choices = asyncio.run(go())
    assert ep.counts["failed"] == 1  # the extend, cancelled with the episode
    trajs = episode_trajectories(ep, StopReason.AGENT_ERROR, "the agent raised")
    last = last_sequence(trajs)
    assert last is trajs[1]
    assert last.turns[-1].assistant.content == choices[1].message.content == "four"
    assert {t.stop_reason for t in trajs} == {StopReason.AGENT_ERROR}
