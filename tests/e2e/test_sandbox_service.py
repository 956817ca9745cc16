"""The local sandbox service end to end on loopback: one-shot calls, sessions, backpressure,
health, and the factory that starts and stops a service of its own."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import httpx
import pytest

from agentrl.sandbox import Limits, SandboxConfig, ServerConfig, ServiceSandbox, make_sandbox
from agentrl.sandbox.server import LocalService


@pytest.fixture(scope="module")
def service() -> Iterator[LocalService]:
    cfg = ServerConfig(warm_workers=2, max_running=4, limits=Limits(wall_s=5, memory_mb=512))
    with LocalService(cfg) as svc:
        yield svc


async def test_health_reports_measured_isolation(service: LocalService) -> None:
    h = service.health()
    iso = h["isolation"]
    assert h["status"] == "ok" and iso["mode"] in ("bwrap", "rlimits")
    assert iso["not_isolated"], "the service must say what it does not isolate"
    if iso["mode"] == "bwrap":
        assert iso["probe"]["net_interfaces"] == ["lo"]
        assert iso["probe"]["host_loopback_reachable"] is False
        assert iso["probe"]["root_writable"] is False
        assert iso["probe"]["processes_visible"] <= 3
        assert set(iso["namespaces"]) >= {"user", "pid", "net", "mount"}


async def test_oneshot_calls(service: LocalService) -> None:
    sb = ServiceSandbox(service.url)
    res = await sb.run("import sys\nprint('out')\nprint('err', file=sys.stderr)")
    assert (res.stdout, res.stderr, res.exit_code, res.ok) == ("out\n", "err\n", 0, True)
    res = await sb.run("def f():\n    return 1 / 0\nf()")
    assert res.exit_code == 1 and res.error_name == "ZeroDivisionError"
    assert 'File "<string>", line 2, in f' in res.stderr and "return 1 / 0" in res.stderr
    assert (await sb.run("raise SystemExit(3)")).exit_code == 3
    res = await sb.run("print(")
    assert res.exit_code == 1 and res.error_name == "SyntaxError"
    await sb.run("open('/tmp/left-behind', 'w').write('x')")  # private /tmp per one-shot call
    res = await sb.run("echo $((6 * 7)); test -e /tmp/left-behind && echo 1 || echo 0; exit 4",
                       language="bash")  # fmt: skip
    assert res.stdout == "42\n0\n" and res.exit_code == 4
    res = await sb.run("x = 1")  # one-shot calls share nothing
    assert (await sb.run("print(x)")).error_name == "NameError"
    with pytest.raises(ValueError, match="unsupported language"):
        await sb.run("1", language="ruby")
    await sb.aclose()


async def test_sessions_keep_state_until_released(service: LocalService) -> None:
    sb = ServiceSandbox(service.url)
    a, b = "traj-a", "traj-b"
    await sb.run("import math\nx = 41\nopen('/tmp/note', 'w').write('kept')", session=a)
    await sb.run("x = 'other'", session=b)
    await sb.run("y = x + 1", session=a)  # turn 2
    res = await sb.run("print(open('/tmp/note').read())\n(x, y, math.pi > 3)", session=a)  # turn 3
    assert res.stdout == "kept\n" and res.result == "(41, 42, True)"
    assert (await sb.run("x", session=b)).result == "'other'"
    res = await sb.run("raise KeyError('k')", session=a)  # an error keeps the session
    assert res.error_name == "KeyError" and not res.session_reset
    assert (await sb.run("y", session=a)).result == "42"
    await sb.close_session(a)
    res = await sb.run("x", session=a)  # a new interpreter for the same key
    assert res.error_name == "NameError"
    await sb.close_session(a)
    await sb.close_session(b)
    await sb.aclose()


async def test_concurrent_calls_all_come_back_right(service: LocalService) -> None:
    sb = ServiceSandbox(service.url)
    results = await asyncio.gather(*(sb.run(f"print({i} ** 2)") for i in range(16)))
    assert [r.stdout for r in results] == [f"{i**2}\n" for i in range(16)]

    async def turns(k: int) -> list[str | None]:
        out = [(await sb.run(f"v = {k}", session=f"c{k}")).result]
        for _ in range(3):
            out.append((await sb.run("v += 1; v", session=f"c{k}")).result)
        await sb.close_session(f"c{k}")
        return out

    runs = await asyncio.gather(*(turns(k) for k in range(6)))
    assert runs == [[None, str(k + 1), str(k + 2), str(k + 3)] for k in range(6)]
    await sb.aclose()


async def test_a_session_closed_during_its_call_answers_cleanly(service: LocalService) -> None:
    """An episode cancelled while its tool call runs closes the session under the call (async
    training's shutdown did): the call comes back saying so, not as a server error."""
    sb = ServiceSandbox(service.url)
    await sb.run("x = 1", session="closing")
    call = asyncio.create_task(
        sb.run("import time\ntime.sleep(3)\nprint('done')", session="closing")
    )
    await asyncio.sleep(0.5)
    await sb.close_session("closing")
    res = await call
    assert res.session_reset and "the session was closed while this call ran" in res.stderr
    assert (await sb.run("x", session="closing")).error_name == "NameError"  # a new one
    assert (await sb.run("print(2 + 2)")).stdout == "4\n"  # and the service is fine
    await sb.aclose()


async def test_busy_answer_and_owned_service_lifecycle() -> None:
    cfg = SandboxConfig(
        backend="service",
        retries=0,
        server=ServerConfig(
            warm_workers=1, max_running=1, max_sessions=1, max_queue=1, session_ttl_s=0.4
        ),
    )
    sb = make_sandbox(cfg)  # starts a service of its own on a free loopback port
    assert isinstance(sb, ServiceSandbox)
    owner = sb._owner
    auth = {"Authorization": f"Bearer {owner.cfg.token}"}  # a started service takes a token
    async with httpx.AsyncClient(timeout=30, headers=auth) as http:
        calls = [
            http.post(f"{sb.url}/v1/run", json={"code": "import time; time.sleep(1)"})
            for _ in range(5)
        ]
        answers = await asyncio.gather(*calls)
        codes = sorted(r.status_code for r in answers)
        busy = [r for r in answers if r.status_code == 503]
        health = (await http.get(f"{sb.url}/health")).json()
    assert codes == [200, 200, 503, 503, 503]  # 1 running + 1 queued; the rest told to retry
    assert busy[0].json()["error"] == "busy" and busy[0].headers["Retry-After"] == "1"
    assert health["counters"]["busy"] == 3
    assert (await sb.run("print('still fine')")).stdout == "still fine\n"
    await sb.run("leased = 1", session="idle")
    await asyncio.sleep(1.0)  # past the 0.4 s lease: the reaper released the interpreter
    res = await sb.run("leased", session="idle")
    assert res.session_reset and res.error_name == "NameError" and "expired" in res.stderr
    await sb.aclose()
    assert owner.proc.poll() is not None  # the service went away with its client


async def test_rlimits_fallback_still_limits_and_says_what_it_lacks() -> None:
    """Where user namespaces are refused the service falls back to rlimits (+cgroups, seccomp,
    a per-worker uid and a network namespace when root) and says so on /health."""
    cfg = ServerConfig(isolation="rlimits", warm_workers=1, limits=Limits(wall_s=2, memory_mb=256))
    async with LocalService(cfg) as svc:
        iso = svc.health()["isolation"]
        sb = ServiceSandbox(svc.url)
        ok = await sb.run("import os\nprint(sorted(k for k in os.environ))")
        loop = await sb.run("while True:\n    pass", timeout=1.0)
        mem = await sb.run("x = bytearray(10 ** 10)")
        state = [(await sb.run(c, session="s")).result for c in ("v = 20", "v * 2 + 2")]
        await sb.aclose()
    assert iso["mode"] == "rlimits" and iso["namespaces"] == []
    assert any("filesystem" in note for note in iso["not_isolated"])
    assert ok.ok and "AGENTRL" not in ok.stdout and "'HOME'" in ok.stdout
    assert loop.timed_out and loop.limit == "wall_time"
    assert mem.limit == "memory"
    assert state == [None, "42"]
