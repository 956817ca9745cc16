"""Excess against the service (issue 36, item 8): a session's output flood between its calls,
code that lifts its own CPU budget, and e2b callers that send malformed bodies or open sandboxes
and contexts without end."""

from __future__ import annotations

import asyncio
import json
import secrets
from collections.abc import Iterator

import httpx
import psutil
import pytest

from agentrl.sandbox import Limits, ServerConfig, ServiceSandbox
from agentrl.sandbox.server import LocalService

LIMITS = Limits(wall_s=5, cpu_s=1, output_bytes=64 * 1024, output_kill_bytes=1 << 20)


@pytest.fixture(scope="module")
def service() -> Iterator[LocalService]:
    cfg = ServerConfig(
        warm_workers=2, max_running=4, limits=LIMITS, e2b_max_sandboxes=3, e2b_max_contexts=2
    )
    with LocalService(cfg) as svc:
        yield svc


def _service_cpu_s(svc: LocalService) -> float:
    assert svc.proc is not None
    t = psutil.Process(svc.proc.pid).cpu_times()  # the service alone, not its sandboxes
    return t.user + t.system


FLOOD = (
    "import sys, threading, time\nchunk = 'x' * 65536\n"
    "def spam():\n    time.sleep(0.1)\n    while True:\n        sys.stdout.write(chunk)\n"
    "threading.Thread(target=spam, daemon=True).start()"
)


async def test_a_flood_between_calls_costs_the_service_nothing(service: LocalService) -> None:
    """A thread printing forever after its call returned once kept the service's pipe readers
    busy until the next call (5.1 CPU-s per 13 s); now they stop at output_kill_bytes and the
    flooder blocks on its full pipe. The next call says the session was reset (output)."""
    sb = ServiceSandbox(service.url, retries=0)
    key, innocent = "flood-" + secrets.token_hex(3), "calm-" + secrets.token_hex(3)
    assert (await sb.run("n = 1", session=innocent)).ok
    assert (await sb.run(FLOOD, session=key)).ok
    await asyncio.sleep(0.5)  # the flood is running, far past output_kill_bytes (1 MB)
    before = _service_cpu_s(service)
    await asyncio.sleep(2.0)
    idle = _service_cpu_s(service) - before
    print(f"service CPU over 2 s of flood: {idle:.3f} s")
    assert idle < 0.3, f"the service spent {idle:.2f} CPU-s on a flood between calls"
    res = await sb.run("1 + 1", session=key)
    assert res.limit == "output" and res.session_reset, res
    assert (await sb.run("2 + 2", session=key)).result == "4"  # a new interpreter serves
    assert (await sb.run("n + 1", session=innocent)).result == "2"
    await sb.close_session(key)
    await sb.close_session(innocent)
    await sb.aclose()


async def test_output_between_calls_below_the_limit_lands_in_the_next_call(
    service: LocalService,
) -> None:
    sb = ServiceSandbox(service.url, retries=0)
    key = "ticks-" + secrets.token_hex(3)
    code = (
        "import threading, time\ndef tick():\n    time.sleep(0.2)\n"
        "    for i in range(3):\n        print('tick', i, flush=True)\n"
        "threading.Thread(target=tick).start()"
    )
    assert (await sb.run(code, session=key)).ok
    await asyncio.sleep(0.6)
    res = await sb.run("print('now')", session=key)
    assert res.stdout == "tick 0\ntick 1\ntick 2\nnow\n" and res.ok, res
    await sb.close_session(key)
    await sb.aclose()


# -- the per-call CPU budget --------------------------------------------------------------

# Lifts its soft RLIMIT_CPU as far as the kernel lets it, shrugs off SIGXCPU, then spins and
# reports the CPU it has used (RUSAGE_SELF: all its threads) every 50 ms of it.
LIFT = (
    "import os, resource, signal, sys\n"
    "signal.signal(signal.SIGXCPU, signal.SIG_IGN)\n"
    "soft, hard = resource.getrlimit(resource.RLIMIT_CPU)\n"
    "for lim in ((1 << 30, 1 << 30), (hard, hard)):\n"
    "    try:\n        resource.setrlimit(resource.RLIMIT_CPU, lim)\n        break\n"
    "    except (ValueError, OSError):\n        pass\n"
    "print('lifted', resource.getrlimit(resource.RLIMIT_CPU), flush=True)\n"
    "def used():\n    r = resource.getrusage(resource.RUSAGE_SELF)\n"
    "    return r.ru_utime + r.ru_stime\n"
    "mark = 0.0\nwhile True:\n    u = used()\n    if u >= mark:\n"
    "        os.write(1, b'cpu %.3f\\n' % u)\n        mark = u + 0.05\n"
)


def _last_cpu(stdout: str) -> float:
    return max(float(line.split()[1]) for line in stdout.splitlines() if line.startswith("cpu "))


@pytest.mark.parametrize("session", [False, True])
async def test_the_code_cannot_lift_its_cpu_budget(service: LocalService, session: bool) -> None:
    """With cpu_s=1 a call that raised its own soft RLIMIT_CPU and ignored SIGXCPU once ran to
    its hard limit (one-shot: killed at 3 CPU-s, unflagged) or its wall time (session: the
    hard limit is the whole session's). Now the service watches its CPU from outside."""
    sb = ServiceSandbox(service.url, retries=0)
    key = "lift-" + secrets.token_hex(3) if session else None
    res = await sb.run(LIFT, timeout=10.0, session=key)
    used = _last_cpu(res.stdout)
    print(f"session={session}: {res.limit} after {used:.2f} CPU-s, {res.duration_s:.2f} s wall")
    assert res.limit == "cpu_time" and not res.timed_out, res
    assert 0.9 <= used <= LIMITS.cpu_s + 0.8, used
    if session:
        assert res.session_reset  # it would not be interrupted: its interpreter was stopped
        assert (await sb.run("1 + 1", session=key)).result == "2"
        await sb.close_session(key)
    await sb.aclose()


async def test_a_session_call_past_its_budget_is_interrupted_and_kept(
    service: LocalService,
) -> None:
    sb = ServiceSandbox(service.url, retries=0)
    key = "spin-" + secrets.token_hex(3)
    await sb.run("kept = 1", session=key)
    res = await sb.run("while True:\n    pass", timeout=5.0, session=key)
    assert res.limit == "cpu_time" and res.error_name == "CPUTimeLimitExceeded", res
    assert not res.session_reset, res
    assert (await sb.run("kept", session=key)).result == "1"
    await sb.close_session(key)
    await sb.aclose()


# -- the e2b layer ------------------------------------------------------------------------


async def test_e2b_malformed_bodies_are_400s_that_say_why(service: LocalService) -> None:
    """A JSON list as the body once answered 500 (AttributeError on `.get`)."""
    async with httpx.AsyncClient(base_url=f"{service.url}/e2b", timeout=30) as http:
        for raw in ("[1, 2]", '"x"', "3", "null", "{not json"):
            r = await http.post("/sandboxes", content=raw)
            assert r.status_code == 400 and "request body" in r.json()["message"], (raw, r.text)
        for bad in ({"templateID": 5}, {"timeout": "soon"}, {"timeout": True}, {"timeout": 0}):
            r = await http.post("/sandboxes", json=bad)
            assert r.status_code == 400, (bad, r.text)
        sid = (await http.post("/sandboxes", json={})).json()["sandboxID"]
        h = {"E2B-Sandbox-Id": sid}
        bad_posts = [
            ("/execute", [1]),
            ("/execute", {"code": 1}),
            ("/execute", {"code": "1", "language": 2}),
            ("/execute", {"code": "1", "language": "cobol"}),
            ("/execute", {"code": "1", "context_id": 7}),
            ("/execute", {"code": "1", "env_vars": [1]}),
            ("/execute", {"code": "1", "env_vars": {"AGENTRL_TIMEOUT": False}}),
            ("/contexts", ["python"]),
            ("/contexts", {"cwd": 1}),
            (f"/sandboxes/{sid}/timeout", [300]),
        ]
        for path, bad in bad_posts:
            r = await http.post(path, content=json.dumps(bad), headers=h)
            assert r.status_code == 400 and r.json()["message"], (path, bad, r.text)
        assert len((await http.get("/contexts", headers=h)).json()) == 0  # nothing was made
        r = await http.post("/execute", json={"code": "1 + 1"}, headers=h)
        assert r.status_code == 200 and '"text": "2"' in r.text
        assert (await http.delete(f"/sandboxes/{sid}")).status_code == 204


async def test_e2b_sandboxes_and_contexts_are_capped(service: LocalService) -> None:
    async with httpx.AsyncClient(base_url=f"{service.url}/e2b", timeout=30) as http:
        sids = [(await http.post("/sandboxes", json={})).json()["sandboxID"] for _ in range(3)]
        over = await http.post("/sandboxes", json={})
        assert over.status_code == 429 and "e2b_max_sandboxes=3" in over.json()["message"]
        h = {"E2B-Sandbox-Id": sids[0]}
        ctx = [await http.post("/contexts", json={}, headers=h) for _ in range(3)]
        assert [r.status_code for r in ctx] == [200, 200, 429], [r.text for r in ctx]
        assert "e2b_max_contexts=2" in ctx[2].json()["message"]
        r = await http.post("/execute", json={"code": "1"}, headers=h)  # its default context
        assert r.status_code == 429
        cid = ctx[0].json()["id"]
        assert (await http.delete(f"/contexts/{cid}", headers=h)).status_code == 204
        r = await http.post("/execute", json={"code": "1 + 1"}, headers=h)
        assert r.status_code == 200 and '"text": "2"' in r.text
        assert len((await http.get("/contexts", headers=h)).json()) == 2
        assert (await http.delete(f"/sandboxes/{sids[2]}")).status_code == 204
        sids[2] = (await http.post("/sandboxes", json={})).json()["sandboxID"]  # a place again
        for sid in sids:
            assert (await http.delete(f"/sandboxes/{sid}")).status_code == 204
