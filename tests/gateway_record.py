"""The gateway tests' recording engine client and their token-exact check (tests/e2e/test_gateway*.py)."""

from __future__ import annotations

from agentrl.engine import EngineClient
from agentrl.rollout import Rollout, RolloutConfig
from agentrl.seeding import sampling_round
from agentrl.types import Trajectory


class Recording:
    """The real engine client, with every call's prompt ids and returned ids kept."""

    def __init__(self, engine: EngineClient) -> None:
        self.engine, self.calls = engine, []

    async def generate(self, input_ids, params, key=None):
        comp = await self.engine.generate(input_ids, params, key)
        self.calls.append((list(input_ids), list(comp.token_ids), list(comp.logprobs)))
        return comp

    def release(self, key: str) -> None:
        self.engine.release(key)


async def rollout_of(urls, tok, env_cls, tasks, **cfg) -> tuple[list[list[Trajectory]], Recording]:
    """The rollout in a seeded round (trainer.deterministic's seeds): what the tiny model samples
    is the same on every machine and under any load, so a test asking for a solved episode
    cannot fail on an unlucky draw."""
    async with EngineClient(urls) as engine:
        rec = Recording(engine)
        ro = Rollout(rec, tok, env_cls, RolloutConfig(max_new_tokens=48, max_context_tokens=700,
                                                       **cfg))  # fmt: skip
        try:
            with sampling_round(0, "test"):
                return await ro.run(tasks), rec
        finally:
            await ro.aclose()


def assert_token_exact(t: Trajectory, rec: Recording) -> None:
    """Each sampled turn: the engine was asked with exactly the ids before it and returned
    exactly its ids and logprobs; the loss mask is 1 on those ids and nowhere else."""
    t.check()  # the mask is 1 exactly on the turns' sampled spans
    calls: dict[tuple, list] = {}
    for ids, out, lps in rec.calls:  # two episodes may ask the same and get the same ids
        calls.setdefault((tuple(ids), tuple(out)), []).append(lps)
    for turn in t.turns:
        key = (tuple(t.token_ids[: turn.start]), tuple(t.token_ids[turn.start : turn.end]))
        assert key in calls, f"turn {turn.start}:{turn.end} is not a call the engine answered"
        assert t.logprobs[turn.start : turn.end] in calls[key]
