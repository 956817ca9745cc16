"""What red-team passes found in the sandbox service, each attack kept here: agentrl's own package
(and the reference answers in its assets) visible in a sandbox, the service's token on its command
line, a turn of slow calls on one session turned into an outage, and page cache counted as the
sandboxes' memory until the service refused every call. The attack suite proper:
test_sandbox_attacks.py; the service and the checks both use: sandbox_kit.py.
"""

from __future__ import annotations

import asyncio
import os
import re
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from sandbox_kit import LIMITS, attack, attacked_service, needs

from agentrl.sandbox import ExecResult, ServerConfig, ServiceSandbox
from agentrl.sandbox.server import LocalService


@pytest.fixture(scope="module")
def service() -> Iterator[LocalService]:
    yield from attacked_service()


@pytest.fixture
def namespaces(service: LocalService) -> None:
    if service.health()["isolation"]["mode"] != "bwrap":
        pytest.skip("this host refused user namespaces: the service runs with rlimits only")


async def test_the_trainers_own_package_is_hidden_where_a_bound_path_holds_it(
    namespaces: None,
) -> None:
    """A wheel install puts agentrl in the site-packages every sandbox reads, and its assets hold
    reference answers (a red-team pass applied a SWE task's reference patch from there). Here the
    checkout is bound read-only as such a path would be: its files show, agentrl's do not."""
    project = Path(__file__).resolve().parents[2]
    tasks = project / "agentrl" / "assets" / "swe" / "tasks.jsonl"
    assert tasks.is_file()
    code = (
        f"import os\nprint(sorted(os.listdir({str(project / 'agentrl')!r})))\n"
        f"print(os.path.exists({str(project / 'pyproject.toml')!r}))\n"
        f"try:\n    open({str(tasks)!r}).read()\nexcept OSError as e:\n    print('denied', e.errno)"
    )
    cfg = ServerConfig(warm_workers=1, max_running=1, limits=LIMITS, ro_paths=[str(project)])
    with LocalService(cfg) as svc:
        res, _ = await attack(svc.url, code, timeout=10.0)
    assert res.ok and res.stdout.split("\n")[:3] == ["[]", "True", "denied 2"], res


async def test_the_service_token_is_not_on_its_command_line() -> None:
    """/proc/<pid>/cmdline is readable by every local user: the service started for a run takes
    its config (with the random token) through its environment, which only its user can read."""
    token = "tok-" + "x" * 40
    with LocalService(ServerConfig(warm_workers=1, token=token)) as svc:
        assert svc.proc is not None
        argv = Path(f"/proc/{svc.proc.pid}/cmdline").read_bytes()
        assert b"agentrl.sandbox.server" in argv and token.encode() not in argv
        run = httpx.post(svc.url + "/v1/run", json={"code": "print(1)"}, timeout=5)
        assert run.status_code == 401  # and still wanted


async def test_a_turn_of_slow_calls_on_one_session_is_never_an_outage(
    service: LocalService, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A red-team pass: six calls of one session sent at once, each sleeping just under the tool
    timeout, were run one at a time by the service while their HTTP deadlines ran from the
    send: the later ones timed out as SandboxUnavailable, an infrastructure failure the policy
    had made (its losing episode left the baseline). The client now sends a session's calls one
    at a time; here with the deadline margin cut to 1 s, so four calls of 0.8 s would overrun."""
    from agentrl.sandbox import client

    monkeypatch.setattr(client, "CALL_MARGIN_S", 1.0)
    sb = ServiceSandbox(service.url, retries=0)
    try:
        runs = [sb.run("import time; time.sleep(0.8); print('ok')", timeout=1.0, session="flood")
                for _ in range(4)]  # fmt: skip
        results = await asyncio.gather(*runs)
    finally:
        await sb.close_session("flood")
        await sb.aclose()
    assert [r.stdout.strip() for r in results] == ["ok"] * 4, results


async def test_files_sandboxes_read_do_not_count_as_their_memory(tmp_path: Path) -> None:
    """A red-team pass: sandboxes that only read files left their page cache charged to the
    sandboxes' cgroup after they ended; the service counted it as memory in use and refused
    every call (`busy`, which a run reads as sandbox_unavailable). It counts the working set."""
    blob = tmp_path / "data" / "blob"
    blob.parent.mkdir()
    with open(blob, "wb") as f:
        for _ in range(150):
            f.write(os.urandom(1 << 20))
        f.flush()
        os.fsync(f.fileno())
        os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)  # the sandbox's reads charge
    cfg = ServerConfig(service_memory_mb=160, warm_workers=1, ro_paths=[str(blob.parent)],
                       limits=LIMITS.model_copy(update={"memory_mb": 128}))  # fmt: skip
    read = f"f = open({str(blob)!r}, 'rb')\nwhile f.read(1 << 20):\n    pass\nprint('read')"
    with LocalService(cfg) as svc:
        needs(svc.health()["isolation"], "memory")
        sb = ServiceSandbox(svc.url, retries=0)
        try:
            assert (await sb.run(read, timeout=30, session="reader")).stdout.strip() == "read"
            await sb.close_session("reader")
            assert svc.health()["memory_mb"]["used"] < 80, svc.health()["memory_mb"]
            assert (await sb.run("print('hi')", timeout=10, session="next")).stdout == "hi\n"
        finally:
            await sb.aclose()


RELAY = r"""
import os, resource, signal, time
def spin():
    hard = resource.getrlimit(resource.RLIMIT_CPU)[1]  # the session's whole budget
    resource.setrlimit(resource.RLIMIT_CPU, (hard, hard))
    t = time.process_time()
    while time.process_time() - t < 0.5:
        pass
    with open("/tmp/burnt", "a") as f:
        f.write(f"{time.process_time()}\n")
if os.fork() == 0:  # the call returns; this relay carries on between calls
    os.setsid()
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # its spinners are reaped by nobody's count
    while True:
        if os.fork() == 0:
            try:
                spin()
            finally:
                os._exit(0)
        try:
            os.wait()
        except ChildProcessError:  # SIG_IGN: wait returns once the child is gone
            pass
print("relay started")
"""
BURNT = "import time; time.sleep(0.3)\ntry:\n    n = sum(map(float, open('/tmp/burnt')))\n" \
        "except OSError:\n    n = 0.0\nprint(f'burnt={n}')"  # fmt: skip


async def test_processes_between_calls_cannot_outspend_the_sessions_cpu_budget() -> None:
    """A red-team pass: `session_cpu_s` was each process's RLIMIT_CPU only. A relay left running
    between calls forked short spinners (each far under its limit, auto-reaped so no parent
    counted them) and burnt CPU for as long as the session lived, starving the host. The service
    now holds the session's cgroup CPU (dead processes included) against the budget."""
    budget = 3.0
    lim = LIMITS.model_copy(update={"session_cpu_s": budget})
    with LocalService(ServerConfig(warm_workers=1, max_running=2, limits=lim)) as svc:
        needs(svc.health()["isolation"], "cpu")
        sb = ServiceSandbox(svc.url, retries=0)
        try:
            assert (await sb.run(RELAY, timeout=10, session="relay")).stdout == "relay started\n"
            burnt, res = 0.0, None
            while burnt <= 2 * budget:  # unfixed, it spends without end
                res = await sb.run(BURNT, timeout=10, session="relay")
                if res.session_reset:
                    break
                burnt = float(re.findall(r"burnt=([0-9.]+)", res.stdout)[-1])
            assert res is not None and res.session_reset and res.limit == "cpu_time", (burnt, res)
            assert burnt <= budget + 1.0, burnt  # one poll of the service's past the budget
            assert (await sb.run("print(1)", timeout=10, session="relay")).stdout == "1\n"
        finally:
            await sb.aclose()


HOLD = "import threading, time\nts = [threading.Thread(target=time.sleep, args=(1e6,), daemon=True)\n" \
       "      for _ in range(6)]\nfor t in ts:\n    t.start()\nprint('holding')"  # fmt: skip


async def test_sandboxes_each_under_five_percent_cannot_fill_the_service_cap_for_all() -> None:
    """A red-team pass: a sandbox was evicted only when it held 5 % of a service-wide cap, and a
    sandbox's own process limit (64 by default) is 1.6 % of the service's (4096). Sessions that
    each held their share filled the cap together, no one could be evicted, and the service
    answered every call busy: `sandbox_unavailable`, the infrastructure's failure, made by the
    code. Here 24 sessions hold 9 tasks each (bwrap, the agent, 6 threads) (5 % of the cap is 12); an innocent call runs, and
    a holder is evicted with limit "processes"."""
    lim = LIMITS.model_copy(update={"processes": 6})  # pids.max 10
    cfg = ServerConfig(warm_workers=1, max_running=4, service_processes=240, limits=lim)
    with LocalService(cfg) as svc:
        needs(svc.health()["isolation"], "pids")
        sb = ServiceSandbox(svc.url, retries=0)
        try:
            for k in range(24):
                res = await sb.run(HOLD, timeout=30, session=f"hold-{k}")
                assert res.stdout == "holding\n", (k, res)
            res = await sb.run("print('innocent')", timeout=30, session="innocent")
            assert res.stdout == "innocent\n" and res.ok, res
            after = [await sb.run("len(ts)", timeout=30, session=f"hold-{k}") for k in range(24)]
            evicted = [r for r in after if r.session_reset]
            assert evicted and all(r.limit == "processes" for r in evicted), after
        finally:
            await sb.aclose()


FILL = "blob = bytearray({mb} << 20)\nfor i in range(0, len(blob), 4096):\n    blob[i] = 1\n" \
       "print('holding')"  # fmt: skip


async def _grading(url: str) -> ExecResult:
    """A one-shot call (a grader's) holding more than any filler, under 5 % of the cap."""
    sb = ServiceSandbox(url, retries=0)
    try:
        return await sb.run(FILL.format(mb=14) + "\nimport time; time.sleep(8)", timeout=30)
    finally:
        await sb.aclose()


async def test_sessions_each_far_under_their_memory_limit_cannot_fill_the_cap_for_all() -> None:
    """A red-team pass, the memory side of the one above: some 100 sessions each holding under a
    tenth of their own memory limit (and under 5 % of the cap) filled the service's memory cap,
    no one could be evicted, and every call was answered busy (`sandbox_unavailable`). Here 36
    sessions hold about 13 MB each of a 480 MB cap (the bars were 24 and 25.6 MB): every call
    runs, the holders evicted report limit "memory", and a one-shot call (a grader's) holding
    more than each of them is not evicted: sessions go first."""
    lim = LIMITS.model_copy(update={"memory_mb": 256})
    cfg = ServerConfig(warm_workers=1, max_running=4, service_memory_mb=480, limits=lim)
    with LocalService(cfg) as svc:
        needs(svc.health()["isolation"], "memory")
        sb = ServiceSandbox(svc.url, retries=0)
        try:
            for k in range(36):
                if k == 30:  # just under the mark: the grader's call comes and holds its share
                    base = svc.health()["memory_mb"]["used"]
                    grading = asyncio.create_task(_grading(svc.url))
                    while svc.health()["memory_mb"]["used"] < base + 16 and not grading.done():
                        await asyncio.sleep(0.05)
                res = await sb.run(FILL.format(mb=8), timeout=30, session=f"fill-{k}")
                assert res.stdout == "holding\n", (k, res)
            res = await sb.run("print('innocent')", timeout=30, session="innocent")
            assert res.stdout == "innocent\n" and res.ok, res
            graded = await grading
            assert graded.stdout == "holding\n" and graded.ok, graded
            after = [await sb.run("len(blob)", timeout=30, session=f"fill-{k}") for k in range(36)]
            evicted = [r for r in after if r.session_reset]
            assert evicted and all(r.limit == "memory" for r in evicted), after
            assert svc.health()["counters"]["busy"] == 0
        finally:
            await sb.aclose()
