"""A synthetic env for benchmarks: fixed prompt length, a fixed number of assistant turns, a
zero-latency "tool" observation after every turn, and a seeded random reward (so GRPO groups have
variance). The model's text is never parsed: any model, random weights included, runs the same
number of turns, which makes step time depend only on the shapes.

    python -m agentrl.train env=custom env._target_=agentrl.envs.synthetic.FixedLengthEnv \
        env.tasks.n=64 env.tasks.prompt_words=120 env.args.turns=4 rollout.max_new_tokens=128
    # a long multi-turn episode: each tool message 5000 words (about one token each)
    ... env.args.turns=4 env.args.observation_words=5000
"""

from __future__ import annotations

import hashlib
import random
from typing import Any

from agentrl.env import AssistantTurn, Env, StepResult
from agentrl.types import Message, Task, Trajectory

_WORDS = [
    "alpha",
    "beta",
    "gamma",
    "delta",
    "epsilon",
    "zeta",
    "theta",
    "kappa",
    "lambda",
    "sigma",
    "omega",
    "river",
    "stone",
    "cloud",
]


class FixedLengthEnv(Env):
    turns: int = 1  # assistant turns per episode
    observation: str = "ok"  # the tool message after each turn but the last
    observation_words: int = 0  # > 0: the tool message is this many words instead (long contexts)

    @classmethod
    def load_tasks(
        cls, n: int = 64, seed: int = 0, prompt_words: int = 100, **_: Any
    ) -> list[Task]:
        """`n` distinct prompts of `prompt_words` words each (about one token per word)."""
        rng = random.Random(seed)
        return [
            Task(id=f"syn-{i}", data={"prompt": " ".join(rng.choices(_WORDS, k=prompt_words))})
            for i in range(n)
        ]

    async def start(self) -> list[Message]:
        return [Message(role="user", content=self.task.data["prompt"])]

    @staticmethod
    def observation_message(text: str = "ok", words: int = 0) -> Message:
        """The tool message: `text`, or with `words` > 0 that many words (about a token each)."""
        if words > 0:
            text = " ".join(_WORDS[i % len(_WORDS)] for i in range(words))
        return Message(role="tool", content=text, name="noop")

    async def step(self, turn: AssistantTurn) -> StepResult:
        if turn.index + 1 >= self.turns:
            return StepResult(done=True)
        return StepResult(
            messages=[self.observation_message(self.observation, self.observation_words)],
            tool_calls=1,
        )

    async def reward(self, trajectory: Trajectory) -> float:
        """Uniform in [0, 1), fixed by task and sample (seeded by their ids)."""
        key = f"{trajectory.task_id}/{trajectory.sample_index}".encode()
        return int.from_bytes(hashlib.sha256(key).digest()[:4], "big") / 2**32
