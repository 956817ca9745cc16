"""The grader's calls never wait behind the policy's own one-shot calls: on the real service, a
flood of stateless python-tool calls (many episodes' `PythonTool(stateful=False)`) that holds
every one-shot slot and fills the queue, or every call the client lets in flight, once made a
reward's `grade()` call busy (503) or wait until the flood drained: under load, rewards became
`sandbox_unavailable` or timed out. Calls made under `sandbox.base.grading()` (`grade` makes
its own so) run in a lane of their own, on the service and in the client."""

from __future__ import annotations

import asyncio

import httpx

from agentrl.sandbox import Limits, ServerConfig, ServiceSandbox
from agentrl.sandbox.grader import asserts_to_tests, grade
from agentrl.sandbox.server import LocalService

SLOW = "import time; time.sleep(60)"  # a tool call that holds its slot until it is cancelled
SOLUTION = "def add(a, b):\n    return a + b"
TESTS = asserts_to_tests("assert add(1, 2) == 3\nassert add(-1, 1) == 0")


async def _until(url: str, running: int, waiting: int) -> None:
    async with httpx.AsyncClient(timeout=10) as http:
        while True:
            health = (await http.get(f"{url}/health")).json()
            if health["running"] >= running and health["waiting"] >= waiting:
                return
            await asyncio.sleep(0.02)


async def test_a_grader_call_runs_while_tool_calls_hold_every_slot_and_the_queue() -> None:
    cfg = ServerConfig(warm_workers=2, max_running=2, max_queue=2, max_sessions=2,
                       limits=Limits(wall_s=70, max_wall_s=70, memory_mb=256))  # fmt: skip
    with LocalService(cfg) as svc:
        async with httpx.AsyncClient(timeout=90) as http:
            body = {"code": SLOW, "timeout": 65}
            flood = [asyncio.create_task(http.post(f"{svc.url}/v1/run", json=body))
                     for _ in range(4)]  # fmt: skip
            await _until(svc.url, running=2, waiting=2)
            over = await http.post(f"{svc.url}/v1/run", json={"code": "print(1)"})
            assert over.status_code == 503  # the policy's own next call: busy, as before
            sb = ServiceSandbox(svc.url, retries=0)  # busy would be SandboxUnavailable at once
            try:
                res = await grade(sb, SOLUTION, TESTS, parallel=2)
            finally:
                await sb.aclose()
            assert not any(t.done() for t in flood)  # the flood still holds its slots
            for t in flood:
                t.cancel()
            await asyncio.gather(*flood, return_exceptions=True)
    assert (res.passed, res.total) == (2, 2), res.notes


async def test_a_grader_call_does_not_wait_behind_the_clients_calls_in_flight() -> None:
    cfg = ServerConfig(warm_workers=2, max_running=8, max_sessions=8,
                       limits=Limits(wall_s=70, max_wall_s=70))  # fmt: skip
    with LocalService(cfg) as svc:
        sb = ServiceSandbox(svc.url, max_concurrency=2)
        try:
            flood = [asyncio.create_task(sb.run(SLOW, timeout=65)) for _ in range(3)]
            await _until(svc.url, running=2, waiting=0)  # two in flight, one held by the client
            res = await grade(sb, SOLUTION, TESTS)
            assert not any(t.done() for t in flood)
            for t in flood:
                t.cancel()
            await asyncio.gather(*flood, return_exceptions=True)
        finally:
            await sb.aclose()
    assert (res.passed, res.total) == (2, 2), res.notes
