"""Whose outcome is whose (the rule: `agentrl.types.StopReason`), on the real sandbox service.

The policy's code cannot turn its own failure into someone else's: a session that fills a
service-wide cap is evicted and gets an ordinary result (`limit="memory"|"processes"`) while every
other call runs; waiting for a slot is the service's time, never the model's timeout; code that
is too large, odd text it prints or raises, and a long task id are results, not tool faults or
infrastructure failures.
"""

from __future__ import annotations

import asyncio
import secrets

import pytest
from sandbox_kit import needs

from agentrl.sandbox import Limits, ServerConfig, ServiceSandbox
from agentrl.sandbox.server import LocalService
from agentrl.tool import ToolContext
from agentrl.tools.python import PythonTool

LIMITS = Limits(wall_s=5, max_wall_s=30, cpu_s=5, memory_mb=256, processes=64, tmp_mb=32)

HOLD_MEMORY = "blob = bytearray(190 << 20)\nprint('held')"
HOLD_THREADS = """
import threading, time
ev = threading.Event()
ts = [threading.Thread(target=ev.wait, daemon=True) for _ in range(56)]
for t in ts: t.start()
print('held', len(ts))
"""


def _key(name: str) -> str:
    return f"{name}-{secrets.token_hex(4)}"


async def _fills_then_innocent_runs(url: str, hold: str, limit: str) -> None:
    sb = ServiceSandbox(url, retries=0)
    attackers = [_key("attacker") for _ in range(3)]
    for key in attackers:
        res = await sb.run(hold, session=key, timeout=10)
        assert res.ok and res.stdout.startswith("held"), res
    # the sandboxes together are past 90 % of the service's cap: every call used to get 503
    innocent = await sb.run("print(6 * 7)", timeout=10)
    assert innocent.ok and innocent.stdout == "42\n", innocent
    s2 = _key("innocent")
    for i in range(3):
        res = await sb.run(f"x = {i}; x", session=s2, timeout=10)
        assert res.ok and res.result == str(i), res
    # the evicted attacker's next call is its own result: the limit it pushed the service to
    outcomes = [await sb.run("print('again')", session=key, timeout=10) for key in attackers]
    evicted = [r for r in outcomes if r.limit == limit]
    assert evicted, outcomes
    for r in evicted:
        assert r.session_reset and r.exit_code is None and "held the most" in r.stderr, r
    # attackers not evicted keep their sessions
    assert all(r.ok for r in outcomes if r.limit is None), outcomes
    await sb.aclose()


async def test_a_session_filling_the_memory_cap_is_evicted_and_others_run() -> None:
    cfg = ServerConfig(warm_workers=2, limits=LIMITS, service_memory_mb=600)
    async with LocalService(cfg) as svc:
        needs(svc.health()["isolation"], "memory")
        await _fills_then_innocent_runs(svc.url, HOLD_MEMORY, "memory")
        assert svc.health()["counters"]["evicted"] >= 1


async def test_a_session_filling_the_process_cap_is_evicted_and_others_run() -> None:
    cfg = ServerConfig(warm_workers=2, limits=LIMITS, service_processes=200)
    async with LocalService(cfg) as svc:
        needs(svc.health()["isolation"], "pids")
        await _fills_then_innocent_runs(svc.url, HOLD_THREADS, "processes")


async def test_waiting_for_a_slot_is_not_the_models_timeout() -> None:
    """Sleeping sessions hold every session slot; the innocent call waits longer than its own
    timeout, then runs within it: the tool reports its output, and the wait as the service's
    (`queue_s`). (One-shot calls have slots of their own: they would not make it wait.)"""
    cfg = ServerConfig(warm_workers=4, max_running=3, limits=LIMITS)
    async with LocalService(cfg) as svc:
        sb = ServiceSandbox(svc.url, retries=0)
        sleepers = [
            asyncio.create_task(sb.run("import time; time.sleep(2.5)", timeout=5, session=f"s{k}"))
            for k in range(3)
        ]
        await asyncio.sleep(0.5)
        ctx = ToolContext(session=_key("innocent"), sandbox=sb, timeout_s=1.5)
        res = await PythonTool().invoke({"code": "print('fine')"}, ctx)
        assert not res.is_error and res.content == "fine", res
        assert res.metadata["queue_s"] > 1.0, res.metadata
        assert all(not r.timed_out for r in await asyncio.gather(*sleepers))
        await sb.aclose()


@pytest.fixture(scope="module")
def service():
    with LocalService(ServerConfig(warm_workers=2, limits=LIMITS, max_code_bytes=4096)) as svc:
        yield svc


async def test_content_the_code_controls_is_the_codes_result(service: LocalService) -> None:
    """What used to be an HTTP 400/422 (booked as a tool exception) is an ordinary result."""
    sb = ServiceSandbox(service.url, retries=0)
    ctx = ToolContext(session=_key("blame"), sandbox=sb, timeout_s=5)
    tool = PythonTool()
    # a lone surrogate in the exception, in the output and in the code itself
    res = await tool.invoke({"code": "raise ValueError('\\ud800')"}, ctx)
    assert res.is_error and not res.is_tool_fault and "ValueError" in res.content, res
    res = await tool.invoke({"code": "import sys; sys.stdout.buffer.write(b'a\\xff\\xfeb')"}, ctx)
    assert not res.is_error and res.content == "a\ufffd\ufffdb", res
    res = await tool.invoke({"code": "x = '\ud800'"}, ctx)
    assert res.is_error and not res.is_tool_fault, res
    # a large trailing value or exception text is cut, never a forged control frame
    for code in ("'y' * 10_000_000", "raise ValueError('z' * 500_000)", "'\\x00' * 100_000"):
        res = await sb.run(code, session=ctx.session, timeout=5)
        assert res.limit is None and not res.session_reset, (code, res.limit, res.stderr[-300:])
        assert len(res.result or res.error_value or "") <= 8 * 1024, code
    # over max_code_bytes, and far over it (the body limit answers before the service reads it)
    for size in (5000, 40_000):
        res = await tool.invoke({"code": "#" * size}, ctx)
        assert res.is_error and not res.is_tool_fault and res.metadata["limit"] == "code_size"
        assert "code_size" in res.content or "size limit" in res.content, res
    # the session still works, and a task id of any length makes a valid session key
    long_ctx = ToolContext(session="t" * 300 + ":0:abcd", sandbox=sb, timeout_s=5)
    for code, want in (("y = 5", "[no output]"), ("print(y)", "5")):
        res = await tool.invoke({"code": code}, long_ctx)
        assert not res.is_error and res.content == want, res
    await sb.close_session(long_ctx.session)
    await sb.aclose()


async def test_a_service_the_client_started_takes_a_token_and_refuses_others() -> None:
    import httpx

    from agentrl.sandbox import SandboxConfig, make_sandbox

    sb = make_sandbox(SandboxConfig(server=ServerConfig(warm_workers=1, limits=LIMITS)))
    try:
        assert isinstance(sb, ServiceSandbox)
        res = await sb.run("print(1)")
        assert res.stdout == "1\n"
        async with httpx.AsyncClient() as http:
            for path in ("/v1/run", "/v1/sessions/close", "/e2b/sandboxes"):
                r = await http.post(sb.url + path, json={"code": "print(2)", "session": "k"})
                assert r.status_code == 401, (path, r.status_code, r.text)
            r = await http.post(
                sb.url + "/v1/run", json={"code": "print(2)"}, headers={"Authorization": "Bearer x"}
            )
            assert r.status_code == 401
    finally:
        await sb.aclose()


async def test_each_model_owned_outcome_reaches_the_advantage(service: LocalService) -> None:
    """Episodes whose code is too large, raises a lone surrogate, or prints invalid UTF-8 end as
    ordinary scored episodes (in the baseline, a non-zero advantage beside a correct one). The
    infrastructure's path (a service that is gone: out of the baseline, advantage 0) is
    tests/unit/test_rollout.py::test_sandbox_down_ends_with_sandbox_unavailable_and_is_not_scored;
    a restarted service's re-issue is tests/e2e/test_sandbox_recovery.py."""
    import json

    from transformers import AutoTokenizer

    from agentrl.advantage import AdvantageConfig, compute_advantages
    from agentrl.assets.build import cached_tokenizer
    from agentrl.envs.code_exec import CodeExecEnv
    from agentrl.rollout import Rollout, RolloutConfig
    from agentrl.types import Completion, FinishReason, StopReason, Task

    tok = AutoTokenizer.from_pretrained(cached_tokenizer("qwen3"))
    codes = ["#" * 5000, "raise ValueError('\\ud800')", "import sys; sys.stdout.buffer.write(b'\\xff')",
             "print(874 - 404 * 99)"]  # fmt: skip

    class Engine:
        async def generate(self, input_ids, params, key=None):
            prompt = tok.decode(input_ids)
            turn = prompt.count("<|im_start|>assistant") - 1
            sample = int(key.split(":")[1]) if key and ":" in key else 0
            if turn == 0:
                text = "<tool_call>\n" + json.dumps({"name": "python", "arguments": {
                    "code": codes[sample % len(codes)]}}) + "\n</tool_call>"  # fmt: skip
            else:
                text = (
                    "<answer>" + prompt.split("<tool_response>\n")[-1].split("\n")[0] + "</answer>"
                )
            ids = tok.encode(text, add_special_tokens=False) + [
                tok.convert_tokens_to_ids("<|im_end|>")
            ]
            return Completion(ids, [-0.5] * len(ids), FinishReason.STOP, weight_version="1")

    task = Task(id="t0", data={"prompt": "Compute 874 - 404 * 99.", "answer": "-39122"})
    sb = ServiceSandbox(service.url, retries=0)
    rollout = Rollout(Engine(), tok, CodeExecEnv, RolloutConfig(group_size=4), sandbox=sb)
    group = list(await asyncio.gather(*(rollout.run_episode(task, i) for i in range(4))))
    await sb.aclose()
    assert [t.stop_reason for t in group] == [StopReason.COMPLETED] * 4, [t.error for t in group]
    assert [t.reward for t in group][:3] == [0.0, 0.0, 0.0] and group[3].reward == 1.0
    adv = compute_advantages([group], AdvantageConfig(name="grpo"))
    assert all(float(a.abs().sum()) > 0 for a in adv.advantages), "each is in the baseline"
