"""The attack suite: hostile code against the local sandbox service on loopback.

For each attack the call must return promptly with the right flag, nothing may escape, and the
service must go on serving the next 100 requests. Reward hacks against the grader:
test_sandbox_reward_hacks.py; the service and the checks both use: sandbox_kit.py.
"""

from __future__ import annotations

import asyncio
import os
import random
import secrets
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from sandbox_kit import LIMITS, SECRET, attack, attacked_service, needs, serves_next_100

from agentrl.env import AssistantTurn, ToolEnv
from agentrl.sandbox import ServerConfig, ServiceSandbox
from agentrl.sandbox.grader import IOTest, grade
from agentrl.sandbox.server import LocalService
from agentrl.tool import ToolContext
from agentrl.tools.python import PythonTool
from agentrl.types import Message, Task, ToolCall


@pytest.fixture(scope="module")
def service() -> Iterator[LocalService]:
    yield from attacked_service()


@pytest.fixture(scope="module")
def isolation(service: LocalService) -> dict:
    return service.health()["isolation"]


@pytest.fixture
def namespaces(isolation: dict) -> None:
    if isolation["mode"] != "bwrap":
        pytest.skip("this host refused user namespaces: the service runs with rlimits only")


# -- time ---------------------------------------------------------------------------------

TIME_ATTACKS = {
    "infinite_loop": "while True:\n    pass",
    "sleep_past_limit": "import time\ntime.sleep(60)",
    "ignore_sigterm": (
        "import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        "signal.signal(signal.SIGINT, signal.SIG_IGN)\nwhile True:\n    time.sleep(0.01)"
    ),
}


@pytest.mark.parametrize("name", sorted(TIME_ATTACKS))
async def test_wall_time_attacks(service: LocalService, name: str) -> None:
    res, elapsed = await attack(service.url, TIME_ATTACKS[name], timeout=1.0)
    assert res.timed_out and res.limit == "wall_time" and res.exit_code is None
    assert elapsed >= 1.0
    await serves_next_100(service.url)


async def test_session_limits_interrupt_the_call_or_reset_the_session(
    service: LocalService,
) -> None:
    sb = ServiceSandbox(service.url, retries=0)
    await sb.run("kept = 1", session="stubborn")
    res = await sb.run(
        "import time\nwhile True:\n    time.sleep(0.01)", timeout=0.5, session="stubborn"
    )
    assert res.timed_out and res.error_name == "TimeoutError" and not res.session_reset
    assert (await sb.run("kept", session="stubborn")).result == "1"  # interrupted, state kept
    res = await sb.run("while True:\n    pass", timeout=10.0, session="stubborn")
    assert res.limit == "cpu_time" and not res.timed_out and not res.session_reset
    assert (await sb.run("kept", session="stubborn")).result == "1"
    code = (
        "import signal, time\nsignal.signal(signal.SIGALRM, signal.SIG_IGN)\n"
        "while True:\n    time.sleep(0.01)"
    )
    res, elapsed = await attack(service.url, code, timeout=0.5, session="stubborn")
    assert res.timed_out and res.limit == "wall_time" and res.session_reset
    assert "variables from earlier calls are gone" in res.stderr
    assert (await sb.run("kept", session="stubborn")).error_name == "NameError"
    await sb.close_session("stubborn")
    await sb.aclose()
    await serves_next_100(service.url)


async def test_cpu_time_limit(service: LocalService) -> None:
    # 1 CPU-second per call (SIGXCPU at the next whole second) long before the 10 s wall limit
    res, _ = await attack(service.url, "while True:\n    pass", timeout=10.0)
    assert res.limit == "cpu_time" and not res.timed_out and res.exit_code == -24
    await serves_next_100(service.url)


# -- processes, memory, disk, output ------------------------------------------------------


async def test_fork_bomb(service: LocalService, isolation: dict) -> None:
    needs(isolation, "pids")
    code = "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass"
    res, _ = await attack(service.url, code)
    assert res.limit == "processes"
    await serves_next_100(service.url)


async def test_shell_fork_bomb(service: LocalService, isolation: dict) -> None:
    needs(isolation, "pids")
    res, _ = await attack(service.url, "bomb() { bomb | bomb & }; bomb; sleep 5", language="bash")
    assert res.limit == "processes" and res.timed_out
    await serves_next_100(service.url)


async def test_thread_bomb(service: LocalService, isolation: dict) -> None:
    needs(isolation, "pids")
    code = "import threading, time\nwhile True:\n    threading.Thread(target=time.sleep, args=(60,)).start()"
    res, _ = await attack(service.url, code)
    assert res.limit == "processes" and "can't start new thread" in res.stderr
    await serves_next_100(service.url)


@pytest.mark.parametrize(
    "code",
    [
        "x = bytearray(10 ** 10)",
        "chunks = []\nwhile True:\n    chunks.append(bytearray(10 ** 7))\n    chunks[-1][::4096] = b'x' * 2442",
    ],
    ids=["one_huge_allocation", "gradual_growth"],
)
async def test_memory_bomb(service: LocalService, code: str) -> None:
    res, _ = await attack(service.url, code)
    assert res.limit == "memory" and res.exit_code != 0
    await serves_next_100(service.url)


@pytest.mark.parametrize(
    "code",
    [
        "with open('big', 'wb') as f:\n    while True:\n        f.write(b'x' * 2 ** 20)",
        "i = 0\nwhile True:\n    open(f'f{i}', 'wb').write(b'x' * 2 ** 20)\n    i += 1",
        "i = 0\nwhile True:\n    open(f'/dev/shm/f{i}', 'wb').write(b'x' * 2 ** 20)\n    i += 1",
    ],
    ids=["one_file", "many_files", "dev_shm"],
)
async def test_disk_fill(service: LocalService, isolation: dict, code: str) -> None:
    if "'big'" not in code:  # one file stops at the file-size limit anywhere
        needs(isolation, "tmpfs")  # many files would fill the host's disk
    res, _ = await attack(service.url, code)
    assert res.limit == "file_size" and res.exit_code != 0
    await serves_next_100(service.url)


async def test_read_only_system(service: LocalService, namespaces: None) -> None:
    code = (
        "import os\nfor p in ['/usr/x', '/etc/x', '/x', '/dev/x']:\n    try:\n"
        "        open(p, 'w')\n        print('WROTE', p)\n    except OSError as e:\n"
        "        print('ro', p, e.errno)\nopen('/tmp/ok', 'w').write('fine')\nprint('tmp ok')"
    )
    res, _ = await attack(service.url, code)
    assert "WROTE" not in res.stdout and res.stdout.count("ro ") == 4 and "tmp ok" in res.stdout


async def test_hundred_megabytes_of_output(service: LocalService) -> None:
    code = "import sys\nsys.stdout.write('x' * 100_000_000)"
    res, elapsed = await attack(service.url, code, timeout=10.0)
    assert res.limit == "output" and res.truncated
    # ended by the output limit, far inside its time limit (margins for a busy 2-core machine)
    assert len(res.stdout) == LIMITS.output_bytes and elapsed < 5.0
    await serves_next_100(service.url)


async def test_invalid_utf8_and_nul_bytes(service: LocalService) -> None:
    code = "import os\nos.write(1, b'ok\\x00\\xff\\xfe\\xc3(\\n')\nos.write(2, b'\\x80err')"
    res, _ = await attack(service.url, code)
    assert res.ok and res.stdout == "ok\ufffd\ufffd\ufffd\ufffd(\n" and res.stderr == "\ufffderr"
    await serves_next_100(service.url)


async def test_input_without_stdin(service: LocalService) -> None:
    code = "name = input('name? ')\nprint(name)"
    res, elapsed = await attack(service.url, code, timeout=10.0)
    assert res.exit_code == 1 and res.error_name == "EOFError" and "EOFError" in res.stderr
    assert elapsed < 5.0  # EOF at once, never a wait for input until the time limit


# -- secrets, filesystem, network, daemons ------------------------------------------------


async def test_no_secrets_in_environment_or_proc(service: LocalService) -> None:
    code = (  # our own environment first: the /proc dump may exceed the output limit
        "import os\nprint(dict(os.environ))\nfor pid in os.listdir('/proc'):\n"
        "    if pid.isdigit():\n        for f in ('environ', 'cmdline'):\n            try:\n"
        "                print(open(f'/proc/{pid}/{f}', 'rb').read())\n"
        "            except OSError as e:\n                print(pid, f, e.errno)\n"
    )
    res, _ = await attack(service.url, code)
    assert res.ok and SECRET not in res.stdout and "AGENTRL_TEST_SECRET" not in res.stdout
    assert "'HOME':" in res.stdout


async def test_host_files_are_not_visible(
    service: LocalService, namespaces: None, tmp_path: Path
) -> None:
    secret_file = tmp_path / "credentials"
    secret_file.write_text(SECRET)
    project = Path(__file__).resolve().parents[2]
    paths = [str(secret_file), str(project / "pyproject.toml"), "/etc/shadow", "/root/.bashrc"]
    code = (
        f"import os\nfor p in {paths!r}:\n    try:\n        print(open(p).read()[:50])\n"
        "    except OSError as e:\n        print('denied', e.errno)\n"
        f"print(sorted(os.listdir({str(project)!r})))"
    )
    res, _ = await attack(service.url, code)
    assert SECRET not in res.stdout and res.stdout.count("denied") == len(paths)
    assert "pyproject.toml" not in res.stdout  # only the interpreter's own files are mounted


async def test_network_and_host_loopback_are_unreachable(
    service: LocalService, namespaces: None
) -> None:
    listener = socket.create_server(("127.0.0.1", 0))  # a host loopback service (dev server, Ray)
    host_port = listener.getsockname()[1]
    svc_port = int(service.url.rsplit(":", 1)[1])
    code = (
        "import socket\n"
        f"for host, port in [('127.0.0.1', {host_port}), ('127.0.0.1', {svc_port}), "
        "('1.1.1.1', 53), ('8.8.8.8', 443)]:\n"
        "    try:\n        socket.create_connection((host, port), timeout=1).close()\n"
        "        print('OPEN', host, port)\n    except OSError as e:\n        print('blocked', e.errno)\n"
        "try:\n    socket.getaddrinfo('example.com', 80)\n    print('OPEN dns')\n"
        "except OSError:\n    print('blocked dns')"
    )
    try:
        res, elapsed = await attack(service.url, code, timeout=10.0)
    finally:
        listener.close()
    assert "OPEN" not in res.stdout and res.stdout.count("blocked") == 5, res.stdout
    assert elapsed < 3.5  # refused at once: four connects left to time out take 4 s or more


def _survivors(tag: str) -> list[int]:
    found = []
    for pid in os.listdir("/proc"):
        try:
            if pid.isdigit() and tag.encode() in Path(f"/proc/{pid}/cmdline").read_bytes():
                found.append(int(pid))
        except OSError:
            pass
    return found


@pytest.mark.parametrize("language", ["python", "bash"])
async def test_daemons_do_not_survive_the_call(service: LocalService, language: str) -> None:
    tag = f"{random.randint(100, 999)}.{random.randint(100000, 999999)}"
    if language == "python":
        code = (
            "import os\npid = os.fork()\nif pid == 0:\n    os.setsid()\n    if os.fork() == 0:\n"
            f"        os.execv('/bin/sleep', ['sleep', '{tag}'])\n    os._exit(0)\n"
            "os.waitpid(pid, 0)\nprint('spawned')"
        )
    else:
        code = f"(setsid nohup sleep {tag} >/dev/null 2>&1 &) ; disown -a; echo spawned"
    res, _ = await attack(service.url, code, language=language)
    assert "spawned" in res.stdout
    deadline = time.monotonic() + 3.0
    while _survivors(tag) and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    assert _survivors(tag) == []


async def test_privilege_escalation_syscalls_are_refused(
    service: LocalService, namespaces: None
) -> None:
    code = (
        "import ctypes, os\nlibc = ctypes.CDLL(None, use_errno=True)\n"
        "print('unshare', libc.unshare(0x10000000), ctypes.get_errno())\n"  # CLONE_NEWUSER
        "print('ptrace', libc.ptrace(16, 1, 0, 0), ctypes.get_errno())\n"  # PTRACE_ATTACH pid 1
        "print('mount', libc.mount(b'none', b'/tmp', b'tmpfs', 0, None), ctypes.get_errno())\n"
        "print('uid', os.getuid())"
    )
    res, _ = await attack(service.url, code)
    assert res.ok and "unshare -1" in res.stdout and "ptrace -1" in res.stdout
    assert "mount -1" in res.stdout and "uid 1000" in res.stdout


async def test_a_real_library_workload_runs_under_the_limits(service: LocalService) -> None:
    pytest.importorskip("numpy")
    code = (
        "import numpy as np\nrng = np.random.default_rng(0)\na = rng.standard_normal((300, 300))\n"
        "w = np.linalg.eigvalsh(a @ a.T)\nprint(round(float(w.min()), 6) >= 0, a.shape)"
    )
    res, _ = await attack(service.url, code, timeout=20.0)
    assert res.ok, res.stderr
    assert res.stdout == "True (300, 300)\n"


# -- the control channel (the agent's socket lives in the code's process) ---------------------

FIND_SOCKET = (
    "import json, os, stat, time\n"
    "fd = next(f for f in range(3, 256) if os.path.exists(f'/proc/self/fd/{f}')\n"
    "          and stat.S_ISSOCK(os.fstat(f).st_mode))\n"
)
CHANNEL_ATTACKS = {
    # a length header of 2 GiB followed by data: the server must not buffer it
    "huge_frame": FIND_SOCKET + "os.write(fd, (2**31).to_bytes(4, 'big'))\n"
    "chunk = b'x' * (1 << 20)\nwhile True:\n    os.write(fd, chunk)",
    # a well-formed frame whose fields have the wrong types: once a 500 the client retried
    "forged_types": FIND_SOCKET + "d = json.dumps({'exit_code': 'boom', 'result': [1]}).encode()\n"
    "os.write(fd, len(d).to_bytes(4, 'big') + d)\ntime.sleep(5)",
    "not_json": FIND_SOCKET + "os.write(fd, (5).to_bytes(4, 'big') + b'\\xff{{{{')\ntime.sleep(5)",
}


@pytest.mark.parametrize("name", sorted(CHANNEL_ATTACKS))
@pytest.mark.parametrize("session", [None, "channel"])
async def test_control_channel_forgery_is_a_result_never_an_outage(
    service: LocalService, name: str, session: str | None
) -> None:
    """Whatever the code writes on the control socket, the call returns 200 with
    limit=control_channel (the worker killed, a session reset), at once, and is never retried:
    a policy cannot turn its failures into `sandbox_unavailable` (left out of training)."""
    key = None if session is None else f"{session}-{name}-{secrets.token_hex(3)}"
    sb = ServiceSandbox(service.url, retries=5, backoff_s=0.05)
    t0 = time.monotonic()
    res = await sb.run(CHANNEL_ATTACKS[name], timeout=10.0, session=key)
    assert time.monotonic() - t0 < 4.0, "the violation should end the call at once"  # else >= 5 s
    assert res.limit == "control_channel" and res.exit_code is None, res
    assert "control channel" in res.stderr
    if key is not None:
        assert res.session_reset
        after = await sb.run("1 + 1", session=key)
        assert after.result == "2" and after.ok
        await sb.close_session(key)
        # through the python tool and an env's step: the model's error, counted as an attack
        env = PyEnv(Task(id="t", data={"prompt": "q"}), ToolContext(key, sb, timeout_s=10.0))
        call = ToolCall(id="1", name="python", arguments={"code": CHANNEL_ATTACKS[name]})
        msg = Message(role="assistant", content="", tool_calls=[call])
        (outcome,) = (await env.step(AssistantTurn(msg, ""))).tool_outcomes
        assert outcome.status == "error" and outcome.tampered, outcome
        await env.close()
    await sb.aclose()
    assert service.health()["counters"]["runs"] > 0


class PyEnv(ToolEnv):
    tools = [PythonTool()]

    async def reward(self, trajectory: object) -> float:
        return 0.0


# -- keys, timeouts, request sizes, the e2b routes --------------------------------------------


async def test_any_task_id_is_a_session_key_and_closes(service: LocalService) -> None:
    """Task ids like `gsm8k/train-17` once got a 404 on close and leaked for the lease (900 s)."""
    sb = ServiceSandbox(service.url, retries=0)
    for key in ("gsm8k/train-17", "a?b#c%2F d", "../../v1/run", "ü/…/%00"):
        await sb.run("x = 1", session=key)
        before = service.health()["sessions"]
        await sb.close_session(key)
        assert service.health()["sessions"] == before - 1, key
    await sb.aclose()


async def test_timeouts_are_checked_never_clamped(service: LocalService) -> None:

    async with httpx.AsyncClient(base_url=service.url, timeout=30) as http:
        big = await http.post("/v1/run", json={"code": "1", "timeout": 61.0})  # max_wall_s=60
        assert big.status_code == 400 and "max_wall_s" in big.json()["detail"]
        for bad in ("NaN", -1.0, 0):
            r = await http.post("/v1/run", content=f'{{"code": "1", "timeout": {bad}}}',
                                headers={"content-type": "application/json"})  # fmt: skip
            assert r.status_code in (400, 422), (bad, r.text)
        huge = await http.post("/v1/run", json={"code": "x" * (8 << 20)})
        assert huge.status_code == 413
        assert (await http.post("/v1/run", json={"code": 12})).status_code in (400, 422)


async def test_e2b_routes_want_the_token_and_sane_timeouts() -> None:

    cfg = ServerConfig(warm_workers=1, limits=LIMITS, token="tok-" + secrets.token_hex(4))
    with LocalService(cfg) as svc:
        async with httpx.AsyncClient(base_url=f"{svc.url}/e2b", timeout=30) as http:
            assert (await http.post("/sandboxes", json={})).status_code == 401
            made = await http.post("/sandboxes", json={}, headers={"X-API-KEY": cfg.token})
            sid = made.json()["sandboxID"]
            assert made.json()["envdAccessToken"] == cfg.token
            run = {"code": "print(1)"}
            no_token = await http.post("/execute", json=run, headers={"E2B-Sandbox-Id": sid})
            assert no_token.status_code == 401  # the id alone once ran code
            auth = {"E2B-Sandbox-Id": sid, "X-Access-Token": cfg.token}
            ok = await http.post("/execute", json=run, headers=auth)
            assert ok.status_code == 200 and '"text": "1\\n"' in ok.text
            for bad in ("nan", "-1", "1e9"):
                body = {"code": "1", "env_vars": {"AGENTRL_TIMEOUT": bad}}
                r = await http.post("/execute", json=body, headers=auth)
                assert r.status_code == 400 and "timeout" in r.text, (bad, r.text)
            r = await http.post("/execute", json={"code": ["x"]}, headers=auth)
            assert r.status_code == 400
            assert (await http.get("/contexts", headers={"E2B-Sandbox-Id": sid})).status_code == 401


# -- an innocent session while others sleep, spin or flood ------------------------------------


async def test_sleepers_do_not_starve_an_innocent_session() -> None:
    """Two `time.sleep(9)` calls once raised an innocent client's p50 from 6.7 ms to 8.8 s (the
    slots were the CPU count). With them and a CPU spinner running, every innocent call of a
    session succeeds, and all 20 finish long before the sleepers do."""
    cfg = ServerConfig(warm_workers=2, limits=LIMITS)  # the default max_running
    with LocalService(cfg) as svc:
        sb = ServiceSandbox(svc.url, retries=0)
        attackers = [
            asyncio.create_task(sb.run("import time; time.sleep(9)", timeout=20, session=f"s{i}"))
            for i in range(4)
        ] + [asyncio.create_task(sb.run("while True: pass", timeout=20))]
        await asyncio.sleep(1.0)  # the attackers are running
        await sb.run("x = 41", session="innocent")
        for _ in range(20):
            res = await sb.run("x += 1; x", session="innocent", timeout=5)
            assert res.ok, res
        assert res.result == "61"
        assert not any(t.done() for t in attackers[:4]), "the sleepers should still be asleep"
        for t in attackers:
            t.cancel()
        await asyncio.gather(*attackers, return_exceptions=True)
        await sb.aclose()


DAEMON_HACK = """
import os, sys, time
k = int(input())
path = '/tmp/agentrl-answers'
if not os.path.exists(path + '.started'):
    open(path + '.started', 'w').close()
    if os.fork() == 0:                      # a daemon: out of the process group and the session
        os.setsid()
        if os.fork() == 0:
            time.sleep(1.3)                 # keeps computing after its own test timed out
            with open(path + '.tmp', 'w') as f:
                f.write(' '.join(str(i * i) for i in range(10)))
            os.rename(path + '.tmp', path)
            time.sleep(60)
        os._exit(0)
t0 = time.time()
while time.time() - t0 < 0.95:
    if os.path.exists(path):
        print(open(path).read().split()[k])
        break
    time.sleep(0.02)
"""


async def test_a_daemon_from_one_test_cannot_answer_the_next(service: LocalService) -> None:
    """Each test runs in a fresh directory and every descendant is killed after it (the harness
    is their subreaper): work a test started cannot go on and answer later tests (this once
    passed 5 of 6 where the honest, too slow program passed 0)."""
    sb = ServiceSandbox(service.url, retries=0)
    tests = [IOTest(stdin=f"{k}\n", expected=f"{k * k}\n") for k in range(1, 7)]
    slow = "import time\nk = int(input())\ntime.sleep(1.3)\nprint(k * k)"
    honest, hacked = await asyncio.gather(  # side by side: each is mostly waiting for its timeouts
        grade(sb, slow, tests, timeout_s=1.0), grade(sb, DAEMON_HACK, tests, timeout_s=1.0)
    )
    await sb.aclose()
    assert honest.passed == 0 and hacked.passed == 0, hacked.outcomes


async def test_a_grading_budget_that_does_not_fit_is_split_or_refused(
    service: LocalService,
) -> None:
    sb = ServiceSandbox(service.url, retries=0)
    tests = [IOTest(stdin="", expected="1\n")] * 12
    res = await grade(sb, "print(1)", tests, timeout_s=4.0, max_call_s=60.0)  # one call each
    assert res.passed == 12, res.outcomes  # none lost as "missing"
    with pytest.raises(ValueError, match="does not fit a sandbox call"):
        await grade(sb, "print(1)", tests, timeout_s=58.0, max_call_s=60.0)  # 58 s + 3 s slack
    await sb.aclose()


async def test_vsock_and_modify_ldt_are_refused(service: LocalService, isolation: dict) -> None:
    if not isolation["seccomp"]:
        pytest.skip("no seccomp filter on this host")
    code = (
        "import ctypes, socket\nlibc = ctypes.CDLL(None, use_errno=True)\n"
        "buf = ctypes.create_string_buffer(16)\n"
        "print('ldt', libc.syscall(154, 0, buf, 16), ctypes.get_errno())\n"
        "try:\n    socket.socket(40, socket.SOCK_STREAM)\n    print('vsock open')\n"
        "except OSError as e:\n    print('vsock', e.errno)"
    )
    res, _ = await attack(service.url, code)
    assert "ldt -1 1" in res.stdout and "vsock 97" in res.stdout, res  # EPERM, EAFNOSUPPORT


async def test_output_between_session_calls_counts_against_the_session(
    service: LocalService,
) -> None:
    """A background thread flooding stdout between calls once wrote without limit."""
    sb = ServiceSandbox(service.url, retries=0)
    key = "flood-" + secrets.token_hex(3)
    flood = (
        "import sys, threading, time\nchunk = 'x' * 65536\n"
        "def spam():\n    time.sleep(0.3)\n    while True:\n        sys.stdout.write(chunk)\n"
        "threading.Thread(target=spam, daemon=True).start()"
    )
    assert (await sb.run(flood, session=key)).ok  # the call itself ends before the flood
    await asyncio.sleep(1.5)  # the thread writes far past output_kill_bytes (1 MB) meanwhile
    res = await sb.run("1 + 1", session=key)
    assert res.limit == "output" and res.session_reset, res
    await sb.close_session(key)
    await sb.aclose()


def test_terminal_control_characters_are_shown_not_obeyed() -> None:
    from rich.console import Console

    from agentrl.display import safe_text, trajectory_panel
    from agentrl.types import Message, StopReason, Trajectory

    evil = "ok\x1b]52;c;cHduZWQ=\x07\x1b[2J\x9b31m\r"
    assert safe_text(evil) == "ok\\x1b]52;c;cHduZWQ=\\x07\\x1b[2J\\x9b31m\\x0d"
    traj = Trajectory(task_id="t\x1b[31m", sample_index=0, token_ids=[1], loss_mask=[0],
                      logprobs=[0.0], prompt_len=1, turns=[], messages=[
                          Message(role="tool", content=evil)], stop_reason=StopReason.COMPLETED,
                      error="boom\x1b[0m")  # fmt: skip
    console = Console(record=True, width=120, force_terminal=True)
    console.print(trajectory_panel(traj))
    out = console.export_text(styles=False)
    assert "\x1b" not in out and "\x07" not in out and "\\x1b]52" in out


async def test_all_sandboxes_together_are_capped_and_admission_says_busy(isolation: dict) -> None:
    """Four idle sessions once held 3.3 GB with no cap over all sandboxes; now the service's
    cgroup caps their sum and, near the cap, the session holding the most is evicted (its next
    call says `limit="memory"`) so that the new call runs: never "busy" for everyone."""
    needs(isolation, "memory")
    cfg = ServerConfig(warm_workers=1, limits=LIMITS, service_memory_mb=320)
    with LocalService(cfg) as svc:
        assert svc.health()["memory_mb"]["total"] == 320
        sb = ServiceSandbox(svc.url, retries=0)
        for k in range(2):
            res = await sb.run("hold = b'x' * (150 << 20)", session=f"hog{k}", timeout=20)
            assert res.ok or res.limit == "memory", res
        third = await sb.run("more = b'x' * (150 << 20)", session="hog2", timeout=20)
        assert third.ok or third.limit == "memory", third  # admitted: a hog made room
        again = [await sb.run("1", session=f"hog{k}") for k in range(2)]
        assert any(r.limit == "memory" and r.session_reset for r in again), again
        assert svc.health()["memory_mb"]["used"] <= 320
        await sb.aclose()
