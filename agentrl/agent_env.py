"""The AgentEnv contract: train an agent you already have, written with any framework.

Its episode is your agent's run. The framework hands `run` an OpenAI client (`openai.AsyncOpenAI`)
whose base URL and key lead to agentrl's gateway (agentrl/gateway/): every chat completion your
agent asks for is sampled by the policy being trained and recorded token-exact. Return the
episode's reward (a float, or a dict with `total`), or return anything and score it in `reward`.

    from agentrl.agent_env import AgentEnv

    class Arith(AgentEnv):
        async def run(self, task, client):
            messages = [{"role": "user", "content": task.data["prompt"]}]
            out = await client.chat.completions.create(model="policy", messages=messages,
                                                       tools=[...])
            ...                              # call tools, send their results, as agents do
            return float(answer == task.data["answer"])

Other frameworks take the same two values: `str(client.base_url)` and `client.api_key`
(LangChain's `ChatOpenAI(base_url=…, api_key=…)`, the OpenAI Agents SDK's
`OpenAIChatCompletionsModel(model=…, openai_client=client)`). An agent in another process or
language: set `command` (argv); it runs with OPENAI_BASE_URL, OPENAI_API_KEY and AGENTRL_TASK
(the task as JSON) in its environment, and the last line of its stdout is its result (a number,
or a JSON object with `total`).

What becomes of an episode (agentrl/types.py, StopReason): the agent returned → `completed`, or
the budget the gateway enforced (`max_turns`: rollout.gateway.max_requests; `length`:
rollout.gateway.max_sampled_tokens; `context_overflow`); the agent raised, or its command failed
→ `agent_error` (scored 0, kept in its group: a policy whose text makes the framework raise must
not hide that; counted against trainer.guards.max_aborted_frac); no rollout server answered →
`aborted` (infrastructure: out of the baseline); the agent never called the model → `aborted`
with that reason (nothing to train). Every chat request is attributed by the episode's key,
never guessed from its text; a history the agent rewrote becomes a second training sequence
(agentrl/gateway/capture.py), scored with the episode's reward.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
from typing import Any, ClassVar

from agentrl.env import Env
from agentrl.types import Message, Task, Trajectory


class AgentEnv(Env):
    """Subclass it and write `run` (or set `command`)."""

    command: ClassVar[list[str] | None] = None
    result: Any = None  # what `run` returned (the rollout sets it)

    async def run(self, task: Task, client: Any) -> Any:
        """Run the agent on `task` with `client` (openai.AsyncOpenAI); return its reward (a
        float or a dict with `total`), or any value `reward` reads from `self.result`."""
        if not self.command:
            raise NotImplementedError(
                f"{type(self).__name__} must implement async run(task, client) or set command"
            )
        return await run_command(self.command, task, str(client.base_url), client.api_key)

    async def start(self) -> list[Message]:
        raise TypeError("an AgentEnv episode is its agent's run(): the rollout calls run")

    async def reward(self, trajectory: Trajectory) -> float | dict[str, float]:
        """Default: what `run` returned. `trajectory` is the episode's last training sequence."""
        if self.result is None:
            raise ValueError(
                f"{type(self).__name__}.run returned None: return the reward from run, or "
                "override reward(trajectory)"
            )
        return self.result


async def run_command(command: list[str], task: Task, base_url: str, api_key: str) -> Any:
    """Run an agent's process; its last stdout line is its result (a number or a JSON object).
    A non-zero exit raises with the end of its stderr."""
    env = {**os.environ, "OPENAI_BASE_URL": base_url, "OPENAI_API_KEY": api_key,
           "AGENTRL_TASK": json.dumps({"id": task.id, **task.data})}  # fmt: skip
    proc = await asyncio.create_subprocess_exec(
        *command, env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    try:
        out, err = await proc.communicate()
    except BaseException:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        await proc.wait()
        raise
    if proc.returncode != 0:
        tail = err.decode(errors="replace")[-2000:]
        raise RuntimeError(f"agent command {command} exited with {proc.returncode}: {tail}")
    lines = [ln for ln in out.decode(errors="replace").splitlines() if ln.strip()]
    if not lines:
        return None
    try:
        return json.loads(lines[-1])
    except json.JSONDecodeError:
        return None
