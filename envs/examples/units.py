"""units: a two-tool environment — the model picks the right converter for the question.

    agentrl preview env=units
    python -m agentrl.train env=units

Each task asks to convert a distance (km → miles) or a weight (kg → pounds); both tools are in
every prompt, so the model has to choose by the question, pass the number under the argument name
the schema gives, and reply with the tool's result. Reward: 1.0 when the reply is within 0.01 of
the right value (component `correct`), plus `format` (default 0) for a reply that is a number.
"""

from __future__ import annotations

import math
import random

from pydantic import BaseModel

from agentrl.env import ToolEnv
from agentrl.tool import Tool, ToolContext, ToolResult
from agentrl.types import Task, Trajectory

FACTORS = {"km_to_miles": 0.621371, "kg_to_pounds": 2.20462}


class KmToMiles(Tool):
    name, description = "km_to_miles", "Convert kilometers to miles."

    class Args(BaseModel):
        km: float

    def __call__(self, args: KmToMiles.Args, ctx: ToolContext) -> ToolResult:
        return ToolResult(content=f"{args.km * FACTORS['km_to_miles']:.2f}")


class KgToPounds(Tool):
    name, description = "kg_to_pounds", "Convert kilograms to pounds."

    class Args(BaseModel):
        kg: float

    def __call__(self, args: KgToPounds.Args, ctx: ToolContext) -> ToolResult:
        return ToolResult(content=f"{args.kg * FACTORS['kg_to_pounds']:.2f}")


QUESTIONS = {
    "km_to_miles": ("Convert {} km to miles.", "How many miles is {} km?"),
    "kg_to_pounds": ("Convert {} kg to pounds.", "How many pounds is {} kg?"),
}


class UnitsEnv(ToolEnv):
    tools = [KmToMiles(), KgToPounds()]
    max_turns = 3
    system_prompt = "Use the tools to answer. Reply with the result only."
    format_reward = 0.0

    @classmethod
    def load_tasks(cls, n: int = 200, seed: int = 0) -> list[Task]:
        rng = random.Random(seed)
        tasks = []
        for i in range(n):
            kind = rng.choice(sorted(QUESTIONS))
            value = rng.randint(1, 300)
            answer = f"{value * FACTORS[kind]:.2f}"
            prompt = rng.choice(QUESTIONS[kind]).format(value)
            tasks.append(Task(id=f"{kind}-{i}", data={"prompt": prompt, "answer": answer}))
        return tasks

    async def reward(self, trajectory: Trajectory) -> dict[str, float]:
        text = self.final_text(trajectory).strip()
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        if not math.isfinite(value):  # "nan", "inf", "1e999": float() takes them, they are not
            return {"total": 0.0, "correct": 0.0, "format": 0.0}  # a reply that is a number
        correct = float(abs(value - float(self.task.data["answer"])) < 0.01)
        return {"total": correct + self.format_reward, "correct": correct, "format": 1.0}
