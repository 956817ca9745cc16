"""Answers the agent never got (agentrl/gateway/answer.py): a request's samples recorded before
the agent went away (or before a sibling sample failed) end the episode as the system's failure,
`aborted`, so they are not trained with a reward they had no part in."""

from __future__ import annotations

import asyncio

import httpx
import pytest
from gateway_post import CannedEngine
from transformers import AutoTokenizer

from agentrl.assets.build import resolve_builtin
from agentrl.gateway import Gateway
from agentrl.parsers import get_parser
from agentrl.types import StopReason

USER = {"role": "user", "content": "What is 1 + 2?"}


@pytest.fixture(scope="module")
def tok():
    return AutoTokenizer.from_pretrained(resolve_builtin("tiny"))


class SecondWaits(CannedEngine):
    """Answers its first call at once; later calls wait until cancelled."""

    async def generate(self, input_ids, params, key=None):  # type: ignore[override]
        if self.calls:
            self.calls.append((list(input_ids), params))
            await asyncio.Event().wait()
        return await super().generate(input_ids, params, key)


def test_an_agent_gone_with_one_of_its_samples_recorded_aborts_the_episode(tok):
    """Before: n=2, the first sample recorded, the second still sampling when the agent's
    client gave up: the first stayed in the episode's record, trained with the episode's
    reward, though the agent never read it (and its retry is another branch)."""
    engine = SecondWaits(tok)
    gw = Gateway(engine, tok, get_parser("hermes"))

    async def run() -> tuple:
        url = await gw.start()
        ep = gw.open("t", 0, "s")
        try:
            async with httpx.AsyncClient(timeout=httpx.Timeout(2.0)) as http:
                with pytest.raises(httpx.TimeoutException):
                    await http.post(f"{url}/chat/completions",
                                    json={"messages": [USER], "n": 2},
                                    headers={"Authorization": f"Bearer {ep.key}"})  # fmt: skip
            for _ in range(200):  # the server sees the connection go
                if ep.stop is not None:
                    break
                await asyncio.sleep(0.05)
        finally:
            await gw.aclose()
        return ep

    ep = asyncio.run(run())
    assert len(engine.calls) == 2
    assert [c.seq.turns != [] for c in ep.sequences] == [True], "the first sample was recorded"
    assert ep.stop is StopReason.ABORTED and "never got" in (ep.error or ""), (ep.stop, ep.error)


def test_an_answer_delivered_leaves_the_episode_going(tok):
    """The answer written from inside the handler (plain and streamed) is read as before."""
    gw = Gateway(CannedEngine(tok), tok, get_parser("hermes"))

    async def run() -> tuple:
        url = await gw.start()
        ep = gw.open("t", 0, "s")
        try:
            async with httpx.AsyncClient() as http:
                auth = {"Authorization": f"Bearer {ep.key}"}
                plain = await http.post(f"{url}/chat/completions", headers=auth,
                                        json={"messages": [USER]})  # fmt: skip
                streamed = await http.post(f"{url}/chat/completions", headers=auth,
                                           json={"messages": [USER], "stream": True})  # fmt: skip
        finally:
            await gw.aclose()
        return ep, plain, streamed

    ep, plain, streamed = asyncio.run(run())
    assert plain.json()["choices"][0]["message"]["content"] == "four"
    assert streamed.text.rstrip().endswith("data: [DONE]") and '"four"' in streamed.text
    assert ep.stop is None
