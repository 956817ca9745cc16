"""Pure parts of sandbox/: output streams, seccomp program, grader comparison, e2b event mapping,
config, and the client's retry semantics against a fake HTTP server on loopback."""

from __future__ import annotations

import asyncio
import json
import os
import struct
import time

import pytest

from agentrl.sandbox import (
    ExecResult,
    SandboxConfig,
    SandboxUnavailable,
    ServiceSandbox,
    SubprocessSandbox,
    make_sandbox,
)
from agentrl.sandbox.e2b_compat import _events
from agentrl.sandbox.grader import (
    CallTest,
    IOTest,
    _frames,
    _judge,
    _same,
    asserts_to_tests,
    canon,
    grade,
    normalize_output,
)
from agentrl.sandbox.seccomp import program
from agentrl.sandbox.worker import _signal_of, _Stream


def test_sandbox_docstring_example_runs() -> None:
    import inspect
    import textwrap

    import agentrl.sandbox.base

    doc = inspect.getdoc(agentrl.sandbox.base)
    block = doc.split("\n\n    import asyncio", 1)[1].split("\n\nSessions keep", 1)[0]
    code = textwrap.dedent("    import asyncio" + block)
    exec(compile(code, "sandbox-example", "exec"), {"__name__": "example"})


# -- output streams ----------------------------------------------------------------------


async def test_stream_cuts_at_marker_split_across_chunks() -> None:
    s = _Stream(keep=100, kill_at=1000)
    s.begin(b"\x1eMARK\x1e")
    for chunk in (b"hello\n\x1eMA", b"RK\x1eleft", b"over"):
        s.feed(chunk)
    assert s.seen.is_set()
    assert s.text() == ("hello\n", False)
    s.begin(b"\x1eNEXT\x1e")  # what came after the marker belongs to the next call
    s.feed(b"!\x1eNEXT\x1e")
    assert s.text() == ("leftover!", False)


async def test_stream_truncates_and_flags_overflow() -> None:
    s = _Stream(keep=4, kill_at=10)
    s.begin(None)
    s.feed(b"abcdefgh")
    assert s.text() == ("abcd", True) and not s.overflow.is_set()
    s.feed(b"ijk")
    assert s.overflow.is_set() and s.total == 11


class _FakePipe:
    """What _Stream asks of its pipe's transport."""

    def __init__(self) -> None:
        self.reading = True

    def is_closing(self) -> bool:
        return False

    def pause_reading(self) -> None:
        self.reading = False

    def resume_reading(self) -> None:
        self.reading = True


async def test_stream_leaves_its_pipe_unread_past_kill_between_calls() -> None:
    """A flood between a session's calls once kept the service reading (and dropping) it."""
    s, pipe = _Stream(keep=4, kill_at=10), _FakePipe()
    s.transport = pipe  # type: ignore[assignment]
    s.begin(b"\x1eM\x1e")
    s.feed(b"out\x1eM\x1eab")  # the call's output, its marker, then background output
    s.feed(b"cdefgh")
    assert s.text() == ("out", False) and pipe.reading and not s.overflow.is_set()
    s.feed(b"ijk")  # 11 bytes between calls: past kill_at
    assert s.overflow.is_set() and not pipe.reading
    s.read(True)
    s.begin(b"\x1eN\x1e")
    assert s.text() == ("abcd", True)  # the next call's head, cut at keep
    s.begin(b"\x1eO\x1e")
    assert s.text() == ("", False)


async def test_stream_without_its_marker_counts_what_follows_the_reply_as_between() -> None:
    s = _Stream(keep=100, kill_at=10)
    s.begin(b"\x1eM\x1e")
    s.feed(b"out")
    s.end()  # the reply came, the marker did not (the code moved fd 1)
    s.feed(b"x" * 11)
    assert s.text() == ("out", False) and s.overflow.is_set()


async def test_a_marker_after_the_reply_is_not_the_next_calls_output() -> None:
    """A red-team pass on a loaded host: the agent's end marker came after the worker's grace,
    was kept as output between calls, and was shown as the next call's stdout."""
    s = _Stream(keep=100, kill_at=1000)
    s.begin(b"\x1eM\x1e")
    s.feed(b"out")
    s.end()  # the reply came, the marker not yet
    s.feed(b"\x1eM\x1ebg")
    s.begin(b"\x1eN\x1e")
    s.feed(b"next\x1eN\x1e")
    assert s.text() == ("bgnext", False)


def test_cpu_watch_reads_proc_and_ends_what_passes_its_budget() -> None:
    import subprocess
    import sys

    from agentrl.sandbox.cpuwatch import CpuWatch, cpu_of, tree

    spin = "import signal\nsignal.signal(signal.SIGXCPU, signal.SIG_IGN)\nwhile True:\n    pass"
    procs = [subprocess.Popen([sys.executable, "-c", spin]) for _ in range(2)]
    try:
        assert {p.pid for p in procs} <= set(tree(os.getpid()))
        agent = cpu_of(procs[0].pid)
        assert agent is not None and agent[1] >= 0
        watch = CpuWatch(lambda: [procs[1].pid, procs[0].pid], agent[0], budget_s=0.1, cpus=1)
        asyncio.run(asyncio.wait_for(watch.run(), 30))  # returns: the agent is past 0.6 CPU-s
        assert procs[0].poll() is None and agent[0] in watch.warned  # the agent: the worker's
        # (the other process may have had less of a busy machine: it is checked on below)
        deadline = time.monotonic() + 30
        while procs[1].poll() is None and time.monotonic() < deadline:
            watch.check()
            time.sleep(0.05)
        assert procs[1].poll() == -9  # the other, deaf to SIGXCPU: SIGKILL past the grace
    finally:
        for p in procs:
            p.kill()
            p.wait()


async def test_stream_replaces_invalid_utf8_and_nul() -> None:
    s = _Stream(keep=100, kill_at=1000)
    s.begin(None)
    s.feed(b"a\x00b\xff\xfec")
    text, _ = s.text()
    assert text == "a\ufffdb\ufffd\ufffdc"
    json.dumps(text)


def test_signal_of_bwrap_and_direct_status() -> None:
    assert _signal_of(152) == 24 and _signal_of(-9) == 9
    assert _signal_of(1) is None and _signal_of(None) is None


def test_seccomp_program_is_well_formed() -> None:
    prog = program()
    if prog is None:
        pytest.skip("seccomp filter is x86_64 only")
    assert len(prog) % 8 == 0 and len(prog) // 8 < 4096
    insns = [struct.unpack("=HBBI", prog[i : i + 8]) for i in range(0, len(prog), 8)]
    assert insns[0] == (0x20, 0, 0, 4)  # load arch
    assert insns[-1] == (0x06, 0, 0, 0x7FFF0000)  # default allow
    denied = {k for code, _, _, k in insns if code == 0x15}
    assert {101, 165, 272, 308, 321} <= denied  # ptrace, mount, unshare, setns, bpf


# -- grader: comparison happens on plain data only ----------------------------------------


def test_canon_tags_types_and_hides_objects() -> None:
    class AlwaysEqual:
        def __eq__(self, other: object) -> bool:
            return True

    assert canon((1, [2.5, "x"], {3: None}, {2, 1})) == {
        "__tuple__": [1, [2.5, "x"], {"__dict__": [[3, None]]}, {"__set__": [1, 2]}]
    }
    assert canon(AlwaysEqual()) == {"__opaque__": "AlwaysEqual"}
    assert canon(float("nan")) == {"__float__": "nan"}


def test_same_is_type_strict_but_numeric() -> None:
    assert _same(3, 3.0, None) and not _same(True, 1, None) and not _same(1, True, None)
    assert not _same([1, 2], canon((1, 2)), None)
    assert _same(0.30000000000000004, 0.3, 1e-9) and not _same(0.30000000000000004, 0.3, None)
    assert not _same({"__opaque__": "AlwaysEqual"}, 5, None)


def test_judge_uses_only_frames_produced_inside() -> None:
    t = CallTest(call="f(1)", expected=2)
    assert _judge(t, {"t": 0, "v": 2, "h": "", "p": "2"}).passed
    assert _judge(t, {"t": 0, "v": "2", "h": "", "p": '"2"'}).status == "wrong"
    assert _judge(t, None).status == "missing"
    assert _judge(t, {"t": 0, "err": "timeout"}).status == "timeout"
    truthy = CallTest(call="f(1)", expected=True, match="truthy")
    assert _judge(truthy, {"t": 0, "v": [1], "h": "", "p": ""}).passed
    assert not _judge(truthy, {"t": 0, "v": {"__opaque__": "X"}, "h": "", "p": ""}).passed
    io = IOTest(stdin="", expected="7 \n\n")
    import hashlib

    sha = hashlib.sha256(b"7").hexdigest()
    assert _judge(io, {"t": 0, "h": sha, "p": "7", "rc": 0, "to": False}).passed
    assert normalize_output("a  \r\nb\n\n") == "a\nb"


def test_frames_need_the_nonce() -> None:
    out = 'xx{"t": 0, "v": 1}\nNONCE {"t": 1, "v": 2}\njunkNONCE {"t": 2, "v": 3}\nNONCE {"t": 1, "v": 9}'
    frames = _frames(out, "NONCE")
    assert sorted(frames) == [1, 2] and frames[1]["v"] == 2


def test_asserts_to_tests_keeps_expected_values_out() -> None:
    code = """
import math
def check(candidate):
    assert candidate([1, 2]) == (1, 2)
    assert 3 == candidate([3])
    assert abs(candidate([0.1]) - 0.1) < 1e-6
    assert math.isclose(candidate([2.0]), 2.0, rel_tol=1e-3)
    assert not candidate([])
    assert candidate([5]) is None
"""
    tests = asserts_to_tests(code)
    assert [t.call for t in tests] == ["candidate([1, 2])", "candidate([3])", "candidate([0.1])",
                                       "candidate([2.0])", "candidate([])", "candidate([5])"]  # fmt: skip
    assert tests[0].expected == (1, 2) and tests[1].expected == 3
    assert tests[2].tolerance == 1e-6 and tests[2].rel_tolerance is None
    assert tests[3].rel_tolerance == 1e-3 and tests[3].tolerance == 0.0  # math.isclose's own
    assert tests[4].match == "truthy" and tests[4].expected is False
    with pytest.raises(ValueError, match="cannot be graded"):
        asserts_to_tests("for i in range(3):\n    assert f(i) > i")


async def test_tolerances_are_absolute_or_relative_as_written() -> None:
    """A red-team pass: an absolute bound was also applied as a relative one, so `return 0`
    passed `abs(candidate(3) - 100) < 1` (|0 - 100| <= 1 * 100), and isclose's default rel_tol
    became an abs_tol of 1e-9 (0 passed `isclose(candidate(0), 1e-12)`)."""
    checks = asserts_to_tests(
        "import math\n"
        "assert abs(candidate(3) - 100) < 1\n"
        "assert abs(candidate(10) - 2500.0) < 1\n"
        "assert math.isclose(candidate(0), 1e-12)\n"
        "assert math.isclose(candidate(1), 1000.0, rel_tol=0.01)\n"
    )
    sb = SubprocessSandbox()
    zero = await grade(sb, "def candidate(x):\n    return 0", checks)
    huge = await grade(sb, "def candidate(x):\n    return 10**9", checks)
    close = await grade(
        sb, "def candidate(x):\n    return {3: 100.5, 10: 2499.2, 0: 1e-12, 1: 1009.0}[x]", checks
    )
    off = await grade(
        sb, "def candidate(x):\n    return {3: 101.5, 10: 2500, 0: 2e-12, 1: 1011.0}[x]", checks
    )
    assert zero.passed == 0 and huge.passed == 0, (zero, huge)
    assert close.all_passed, close
    assert off.passed == 1 and off.outcomes[1].passed  # only 2500 itself


@pytest.mark.parametrize("code", ["\ud800", "print(1)\x00"])
async def test_code_the_subprocess_backend_cannot_pass_is_the_codes_error(code) -> None:
    """A lone surrogate or a NUL in the model's code raised in the subprocess backend's own
    exec, counted as the tool's fault (a red-team pass); the service reports them as the code's.
    Now they are the code's error here too."""
    res = await SubprocessSandbox().run(code)
    assert res.exit_code == 1 and not res.ok and res.stderr


async def test_grade_on_the_subprocess_backend() -> None:
    """The grader needs only the Sandbox contract: it also runs on the no-service backend."""
    sb = SubprocessSandbox()
    tests = asserts_to_tests("assert add(2, 3) == 5\nassert add(-1, 1) == 0")
    good = await grade(sb, "def add(a, b):\n    return a + b", tests)
    hack = await grade(
        sb, "class A:\n    def __eq__(s, o): return True\ndef add(a, b): return A()", tests
    )
    io = await grade(sb, "print(int(input()) * 2)", [IOTest(stdin="21\n", expected="42")])
    assert good.all_passed and hack.passed == 0 and io.all_passed


# -- e2b event mapping --------------------------------------------------------------------


def test_e2b_events_split_traceback_and_result() -> None:
    res = ExecResult(
        stdout="hi\n",
        stderr="warn\nTraceback (most recent call last):\nZeroDivisionError: x\n",
        exit_code=1,
        error_name="ZeroDivisionError",
        error_value="x",
    )
    ev = _events(res, 3)
    kinds = [e["type"] for e in ev]
    assert kinds == ["stdout", "stderr", "error", "end_of_execution", "number_of_executions"]
    assert ev[1]["text"] == "warn\n" and ev[2]["traceback"].startswith("Traceback")
    ok = _events(ExecResult(result="42"), 1)
    assert ok[0] == {"type": "result", "text": "42", "is_main_result": True}
    to = _events(ExecResult(timed_out=True, exit_code=None, limit="wall_time"), 1)
    assert to[0]["name"] == "TimeoutError"


# -- config and factory -------------------------------------------------------------------


def test_config_forbids_unknown_keys() -> None:
    with pytest.raises(ValueError, match="extra"):
        SandboxConfig(backend="service", urll="x")  # type: ignore[call-arg]
    with pytest.raises(ValueError, match="unknown sandbox backend 'docker'.*e2b, service"):
        make_sandbox(SandboxConfig(backend="docker"))  # names are checked by the registry


async def test_make_sandbox_subprocess_runs_code() -> None:
    sb = make_sandbox(SandboxConfig(backend="subprocess"))
    assert isinstance(sb, SubprocessSandbox)
    res = await sb.run("print(6 * 7)", timeout=10)
    assert res.stdout == "42\n" and res.ok
    svc = make_sandbox(SandboxConfig(backend="service", url="http://127.0.0.1:9"))
    assert isinstance(svc, ServiceSandbox)
    await svc.aclose()


# -- client retries against a fake HTTP server --------------------------------------------


class FakeService:
    """A loopback HTTP/1.1 server answering from a script of (status, body) pairs."""

    def __init__(self, script: list[tuple[int, dict | None]]) -> None:
        self.script = script
        self.requests: list[bytes] = []
        self.server: asyncio.AbstractServer | None = None
        self.url = ""

    async def __aenter__(self) -> FakeService:
        self.server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        self.url = f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self.server is not None
        self.server.close()
        await self.server.wait_closed()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await self._serve(reader, writer)
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.CancelledError):
            writer.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            length = 0
            for line in head.split(b"\r\n"):
                if line.lower().startswith(b"content-length:"):
                    length = int(line.split(b":")[1])
            body = await reader.readexactly(length)
            self.requests.append(body)
            status, payload = self.script[min(len(self.requests), len(self.script)) - 1]
            if payload is None:  # drop the connection mid-call
                writer.close()
                return
            data = json.dumps(payload).encode()
            writer.write(
                f"HTTP/1.1 {status} X\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(data)}\r\n\r\n".encode()
                + data
            )
            await writer.drain()


OK = ExecResult(stdout="ok\n").model_dump()
BUSY = {"error": "busy", "detail": "sandbox busy"}


async def test_client_retries_busy_then_succeeds() -> None:
    async with FakeService([(503, BUSY), (429, BUSY), (200, OK)]) as fake:
        sb = ServiceSandbox(fake.url, retries=3, backoff_s=0.01, backoff_max_s=0.02)
        res = await sb.run("print('ok')", session="s1")
        await sb.aclose()
    assert res.stdout == "ok\n" and len(fake.requests) == 3


@pytest.mark.parametrize("status", [500, 502, 504])
async def test_a_session_call_is_never_replayed_after_a_server_error(status: int) -> None:
    """The code may have run: no second run (finding: a forged reply gave a 500, the client ran
    the code six times, then called the episode sandbox_unavailable)."""
    async with FakeService([(status, {"error": "x"}), (200, OK)]) as fake:
        sb = ServiceSandbox(fake.url, retries=5, backoff_s=0.01)
        with pytest.raises(SandboxUnavailable, match=f"HTTP {status} after the call was sent"):
            await sb.run("x += 1", session="s1")
        assert len(fake.requests) == 1
        res = await sb.run("print('ok')")  # a one-shot call may be replayed
        await sb.aclose()
    assert res.stdout == "ok\n"


async def test_only_a_graders_one_shot_calls_go_in_the_graders_lane() -> None:
    """`grading()` marks the calls made inside it, and in the tasks started inside it (grade()
    runs its tests as tasks), for the service's grader lane; a session call keeps its own."""
    from agentrl.sandbox.base import grading, is_grading

    async with FakeService([(200, OK)]) as fake:
        sb = ServiceSandbox(fake.url)
        await sb.run("tool()")
        with grading():
            await asyncio.gather(sb.run("graded()"), sb.run("state()", session="s1"))
        assert not is_grading()
        await sb.run("tool()")
        await sb.aclose()
    lanes = {json.loads(r)["code"]: json.loads(r).get("lane") for r in fake.requests}
    assert lanes == {"tool()": None, "graded()": "grader", "state()": None}


async def test_client_gives_up_with_sandbox_unavailable() -> None:
    async with FakeService([(503, BUSY)]) as fake:
        sb = ServiceSandbox(fake.url, retries=2, backoff_s=0.01, backoff_max_s=0.02)
        with pytest.raises(SandboxUnavailable, match="after 3 attempt"):
            await sb.run("1")
        await sb.aclose()
    assert len(fake.requests) == 3


async def test_client_unreachable_raises_sandbox_unavailable() -> None:
    sb = ServiceSandbox("http://127.0.0.1:9", retries=1, backoff_s=0.01)
    with pytest.raises(SandboxUnavailable, match="unavailable"):
        await sb.run("1")
    await sb.close_session("s")  # swallowed: the lease expires on its own
    await sb.aclose()


async def test_session_call_is_not_replayed_after_a_dropped_connection() -> None:
    async with FakeService([(200, None), (200, None), (200, OK)]) as fake:
        sb = ServiceSandbox(fake.url, retries=3, backoff_s=0.01)
        with pytest.raises(SandboxUnavailable):
            await sb.run("x += 1", session="s1")
        assert len(fake.requests) == 1  # running it twice would corrupt the session
        res = await sb.run("print('ok')")  # a one-shot call is safe to replay
        await sb.aclose()
    assert res.stdout == "ok\n" and len(fake.requests) == 3


async def test_client_rejects_bad_requests_without_retrying() -> None:
    async with FakeService([(400, {"error": "bad_request", "detail": "language"})]) as fake:
        sb = ServiceSandbox(fake.url, retries=3, backoff_s=0.01)
        with pytest.raises(ValueError, match="rejected"):
            await sb.run("1", language="cobol")
        await sb.aclose()
    assert len(fake.requests) == 1


def test_the_agents_own_json_writer_matches_json_and_escapes_what_utf8_cannot_carry() -> None:
    """The in-sandbox agent writes its replies without importing json (start-up is paid per
    worker); whatever it writes must parse to the same values on the server."""
    import ast
    import math
    import subprocess
    import sys

    from agentrl.sandbox.isolation import AGENT_SRC

    ns: dict = {"__name__": "agent_under_test"}
    exec(compile(AGENT_SRC.rsplit("\nmain()", 1)[0], "<agent>", "exec"), ns)
    dumps = ns["_dumps"]
    tricky = '\x00\x01\n\t"\\/ é 中 \U0001f600 \x7f \u2028'
    reply = {"exit_code": 1, "error_name": "ValueError", "error_value": tricky, "result": None,
             "timed_out": False, "ready": True, "warnings": ["a", tricky], "t": 0.25,
             "errno": -2, "big": 2**70}  # fmt: skip
    assert json.loads(dumps(reply)) == reply
    assert dumps(reply).encode("utf-8")  # valid UTF-8 as sent
    assert json.loads(dumps("\ud800x\udfff")) == "\ud800x\udfff"  # lone surrogates escaped
    assert json.loads(dumps([math.inf, math.nan, 1e-300])) == [None, None, 1e-300]

    class Sneaky(str):
        def translate(self, table):  # a subclass cannot change what is written
            return "forged"

    assert json.loads(dumps(Sneaky('x"y'))) == 'x"y'
    # the agent itself starts with C modules only (no json, ast, enum, re)
    probe = ("import sys; before = set(sys.modules)\n" + AGENT_SRC.rsplit("\nmain()", 1)[0]
             + "\nprint(sorted(set(sys.modules) - before))")  # fmt: skip
    out = subprocess.run([sys.executable, "-I", "-S", "-c", probe], capture_output=True,
                         text=True, check=True).stdout  # fmt: skip
    assert not {"json", "ast", "enum", "re", "signal"} & set(ast.literal_eval(out)), out
