"""slow_tools: code_exec whose tool calls take as long as real ones do (a sandbox far away, an
API, a test suite): every call waits a random latency before it runs.

    python -m agentrl.train env=code_exec env._target_=agentrl.envs.examples.slow_tools.SlowToolsEnv
    python bench/async_speedup.py          # sync vs async training on it

The latency of a call is drawn log-uniformly between `tool_latency_s` = (low, high), so most
calls are quick and some are ten times slower; with `tail_prob` a call takes `tail_s` instead (a
long tail of slow episodes). Draws come from a generator seeded by the episode, so a rerun sees
the same latencies. Everything else (tasks, tool, reward) is code_exec's.
"""

from __future__ import annotations

import asyncio
import math
import random
import zlib

from agentrl.envs.code_exec import CodeExecEnv
from agentrl.tool import ToolResult
from agentrl.types import ToolCall


class SlowToolsEnv(CodeExecEnv):
    tool_latency_s: tuple[float, float] = (0.05, 0.5)
    tail_prob: float = 0.05
    tail_s: float = 2.0

    async def call_tool(self, call: ToolCall) -> ToolResult:
        rng = getattr(self, "_latency_rng", None)
        if rng is None:
            episode = self.ctx.session.rsplit(":", 1)[0]  # task:sample, without the run-unique tail
            rng = self._latency_rng = random.Random(zlib.crc32(episode.encode()))
        low, high = self.tool_latency_s
        delay = math.exp(rng.uniform(math.log(low), math.log(high)))
        if rng.random() < self.tail_prob:
            delay = self.tail_s
        await asyncio.sleep(delay)
        result = await super().call_tool(call)
        return result.model_copy(update={"latency_s": result.latency_s + delay})
