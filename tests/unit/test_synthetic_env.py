"""The synthetic benchmark env's tool latency (envs/synthetic.py): lognormal waits of the asked
median and tail, the same for the same episode and turn, and really waited (at least)."""

import asyncio
import statistics
import time

from agentrl.env import AssistantTurn
from agentrl.envs.synthetic import FixedLengthEnv
from agentrl.tool import ToolContext
from agentrl.types import Message, Task


def env(i: int, **kw) -> FixedLengthEnv:
    return FixedLengthEnv(
        Task(id=f"t{i}", data={"prompt": "x"}), ToolContext(session=f"s{i}"), **kw
    )


def test_tool_latency_is_lognormal_with_the_asked_median_and_fixed_per_turn():
    waits = sorted(env(i, tool_latency_ms=200).tool_latency_s(1) for i in range(4000))
    assert abs(statistics.median(waits) - 0.2) < 0.02
    assert 7 < waits[int(0.99 * len(waits))] / 0.2 < 13  # sigma 1: p99 is 10x the median
    assert env(3, tool_latency_ms=200).tool_latency_s(2) == env(
        3, tool_latency_ms=200
    ).tool_latency_s(2)
    assert env(3, tool_latency_ms=200).tool_latency_s(1) != env(
        3, tool_latency_ms=200
    ).tool_latency_s(2)


def test_a_step_waits_its_latency():
    turn = AssistantTurn(Message(role="assistant", content="hi"), "hi", index=0)
    slow = env(1, turns=2, tool_latency_ms=50)
    t0 = time.perf_counter()
    res = asyncio.run(slow.step(turn))
    assert time.perf_counter() - t0 >= slow.tool_latency_s(0) and not res.done
