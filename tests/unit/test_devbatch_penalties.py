"""The dev server's frequency, presence and repetition penalties (agentrl/engine/dev/batch.py
`penalized`), as SGLang's penalizers apply them: over the ids the request sampled, before the
temperature. They were a 400 ("not supported by the dev server"), so `agentrl gateway` under
rollout.gateway.sampling=request answered a request with penalties 502 and aborted its episode."""

from __future__ import annotations

import asyncio

import pytest
import torch

from agentrl.engine.dev.batch import penalized
from agentrl.engine.dev.request import BadRequest, Limits, Req, parse_generate


def req(out: list[int], **penalties: float) -> Req:
    return Req(rid="r", prompt=[1], max_new_tokens=8, temperature=1.0, top_p=1.0, top_k=-1,
               min_p=0.0, stop_ids=frozenset(), ignore_eos=True, return_logprob=True, gen=None,
               fut=None, out=list(out), **penalties)  # fmt: skip


def test_penalties_against_numbers_computed_by_hand():
    logits = torch.tensor([2.0, -1.0, 0.5, 1.0])
    r = req([0, 0, 1], repetition_penalty=2.0, frequency_penalty=0.5, presence_penalty=0.25)
    # repetition: 2 / 2 = 1, -1 * 2 = -2 (ids 0, 1 sampled); frequency: 0.5 x (2, 1) times;
    # presence: 0.25 once each; ids 2 and 3, never sampled, unchanged
    assert penalized(logits, r).tolist() == [1.0 - 1.0 - 0.25, -2.0 - 0.5 - 0.25, 0.5, 1.0]
    assert penalized(logits, req([])).tolist() == logits.tolist()  # nothing sampled yet
    assert not req([0]).penalized and req([0], presence_penalty=-0.5).penalized


def parse(sp: dict) -> list[Req]:
    async def go():
        body = {"input_ids": [1, 2], "sampling_params": {"max_new_tokens": 4, **sp}}
        return parse_generate(body, Limits(vocab_size=100, context_len=64, inflight={}))[0]

    return asyncio.run(go())


def test_penalties_are_read_within_sglangs_ranges():
    (r,) = parse({"frequency_penalty": 1.5, "presence_penalty": -2, "repetition_penalty": 1.2})
    assert (r.frequency_penalty, r.presence_penalty, r.repetition_penalty) == (1.5, -2.0, 1.2)
    for key, value in (("frequency_penalty", 2.5), ("presence_penalty", float("nan")),
                       ("repetition_penalty", 0.0)):  # fmt: skip
        with pytest.raises(BadRequest, match=f"sampling_params.{key} must be"):
            parse({key: value})


def test_a_penalized_greedy_request_takes_the_argmax_of_the_penalized_logits():
    """Through the engine's batch: each greedy id is the argmax of a plain forward's logits
    penalized by the ids before it, and its logprob that distribution's; the same request
    without penalties repeats itself (the tiny model's greedy loop), with them it does not."""
    from agentrl.assets.build import resolve_builtin
    from agentrl.engine.dev.batch import BatchEngine

    engine = BatchEngine(str(resolve_builtin("tiny")), "cpu", torch.float32, "sdpa", 0)
    prompt = [97, 11, 187, 0, 434, 525, 498]

    def run(**penalties: float) -> Req:
        r = req([], **penalties)
        r.prompt, r.temperature, r.max_new_tokens = prompt, 0.0, 16
        engine.step([r])
        while r.finish is None:
            engine.step([])
        return r

    plain = run()
    r = run(frequency_penalty=2.0, presence_penalty=1.0, repetition_penalty=1.5)
    assert len(set(plain.out)) < len(plain.out) and r.out != plain.out
    with torch.no_grad():
        logits = engine.model(torch.tensor([prompt + r.out])).logits[0].float()
    for t, tok in enumerate(r.out):
        row = penalized(logits[len(prompt) - 1 + t], req(r.out[:t], frequency_penalty=2.0,
                                                         presence_penalty=1.0,
                                                         repetition_penalty=1.5))  # fmt: skip
        assert int(row.argmax()) == tok
        assert abs(torch.log_softmax(row, -1)[tok].item() - r.logprobs[t]) < 1e-4
