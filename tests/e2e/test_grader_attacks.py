"""Attacks on the grader itself, run in the local sandbox service: state carried from one test to
the next, a time limit the solution can dodge, processes that outlive their test, a stopped
harness, and reports too large for the output the service keeps. Each attack must score 0 (or
only the tests it honestly passes) and each honest solution full marks. The cheap reward hacks
(early exit, patched builtins, forged reports) are in test_sandbox_reward_hacks.py."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import pytest
from sandbox_kit import attacked_service, needs, serves_next_100

from agentrl.sandbox import ExecResult, SandboxUnavailable, ServiceSandbox
from agentrl.sandbox.grader import _SLACK_S, CallTest, GradeResult, IOTest, grade
from agentrl.sandbox.server import LocalService


@pytest.fixture(scope="module")
def service() -> Iterator[LocalService]:
    yield from attacked_service()


@pytest.fixture(scope="module")
def isolation(service: LocalService) -> dict:
    return service.health()["isolation"]


def squares(n: int) -> list[IOTest]:
    return [IOTest(stdin=f"{k}\n", expected=f"{k * k}\n") for k in range(n)]


# -- nothing carries over between tests ---------------------------------------------------

# 16 steps of 0.1 s: a test with a 1 s limit gets through 10 of them. Saving the steps done
# where the next test can see them, the old grader passed 5 of 6 tests (the honest program 0).
SLOW = "import time\nk = int(input())\nfor _ in range(16):\n    time.sleep(0.1)\nprint(k * k)"
RESUME = """
import os, time
k = int(input())
spots = ['/tmp', '/dev/shm', '/var/tmp', os.path.expanduser('~'), os.getcwd() + '/..']
done = 0
for d in spots:
    try:
        done = max(done, int(open(d + '/progress').read()))
    except (OSError, ValueError):
        pass
while done < 16:
    time.sleep(0.1)
    done += 1
    for d in spots:
        try:
            open(d + '/progress', 'w').write(str(done))
        except OSError:
            pass
print(k * k)
"""


async def test_progress_saved_by_a_test_is_gone_for_the_next(
    service: LocalService, isolation: dict
) -> None:
    needs(isolation, "tmpfs")  # a fresh /tmp per call is what the service gives here
    sb = ServiceSandbox(service.url, retries=0)
    tests = squares(3)
    honest, slow, resumed = await asyncio.gather(
        grade(sb, "k = int(input())\nprint(k * k)", tests, timeout_s=1.0),
        grade(sb, SLOW, tests, timeout_s=1.0),
        grade(sb, RESUME, tests, timeout_s=1.0),
    )
    await sb.aclose()
    assert honest.all_passed and not honest.notes, honest
    assert slow.passed == 0 and resumed.passed == 0, resumed.outcomes
    assert {o.status for o in resumed.outcomes} == {"timeout"}


# -- the time limit is kept from outside the solution, load time included -------------------

CATCH_THE_TIMEOUT = """
import signal, time
for s in signal.valid_signals():
    try:
        signal.signal(s, signal.SIG_IGN)
    except (OSError, ValueError, RuntimeError):
        pass
def f(k):
    t0 = time.time()
    while True:
        try:
            while time.time() - t0 < 1.6:
                time.sleep(0.05)
            return k * k
        except BaseException:  # the old runner's alarm exception: caught, and work goes on
            continue
"""
WORK_AT_IMPORT = """
import time
TABLE = {}
for k in range(16):  # 1.6 s before any call starts: the old runner armed no alarm here
    time.sleep(0.1)
    TABLE[k] = k * k
def f(k):
    return TABLE[k]
"""
SLOW_CALL = "import time\ndef f(k):\n    time.sleep(1.6)\n    return k * k"


async def test_the_time_limit_cannot_be_caught_or_dodged_at_import(service: LocalService) -> None:
    sb = ServiceSandbox(service.url, retries=0)
    tests = [CallTest(call=f"f({k})", expected=k * k) for k in range(3)]
    t0 = time.monotonic()
    honest, *attacks = await asyncio.gather(
        grade(sb, "def f(k):\n    return k * k", tests, timeout_s=1.0),
        grade(sb, SLOW_CALL, tests, timeout_s=1.0),
        grade(sb, CATCH_THE_TIMEOUT, tests, timeout_s=1.0),
        grade(sb, WORK_AT_IMPORT, tests, timeout_s=1.0),
    )
    elapsed = time.monotonic() - t0
    await sb.aclose()
    assert honest.all_passed and not honest.notes, honest
    for res in attacks:
        assert res.passed == 0, res.outcomes
        assert {o.status for o in res.outcomes} == {"timeout"}, res.outcomes
    assert elapsed < len(tests) * (1.0 + _SLACK_S), f"took {elapsed:.1f}s"


# -- every process of a test dies with it --------------------------------------------------

# Test 0 starts a chain that keeps forking new sessions (up to the sandbox's process limit) and
# saves its own answers; the old reaper left 43-64 of them alive in later tests. Later tests
# answer honestly only when nothing of test 0 is left: a process, or a file.
HYDRA = """
import os, time
k = int(input())
if k == 0:
    for _ in range(3):
        if os.fork() == 0:
            while True:
                try:
                    if os.fork() == 0:
                        os.setsid()
                        continue
                except OSError:
                    pass
                try:
                    open('/tmp/hydra', 'w').write(' '.join(str(i * i) for i in range(9)))
                except OSError:
                    pass
                time.sleep(0.01)
    time.sleep(60)
me = {os.getpid(), os.getppid(), 1}
alive = [p for p in os.listdir('/proc') if p.isdigit() and int(p) not in me]
if alive or os.path.exists('/tmp/hydra'):
    print('left from test 0:', len(alive), 'processes,', os.path.exists('/tmp/hydra'))
else:
    print(k * k)
"""


async def test_a_regrowing_fork_chain_dies_with_its_test(
    service: LocalService, isolation: dict
) -> None:
    needs(isolation, "tmpfs")
    if isolation["mode"] != "bwrap":
        pytest.skip("processes of other sandboxes are visible without a PID namespace")
    sb = ServiceSandbox(service.url, retries=0)
    t0 = time.monotonic()
    res = await grade(sb, HYDRA, squares(3), timeout_s=1.0)
    elapsed = time.monotonic() - t0
    await sb.aclose()
    assert [o.status for o in res.outcomes] == ["timeout", "pass", "pass"], res.outcomes
    assert elapsed < 1.0 + _SLACK_S + 4.0, f"took {elapsed:.1f}s"
    await serves_next_100(service.url)


# -- a stopped harness costs its own test's budget -----------------------------------------

STOP_THE_HARNESS = """
import os, signal
k = int(input())
if k == 0:
    os.kill(os.getppid(), signal.SIGSTOP)
print(k * k)
"""
# signals that once ended the harness with an exception (SIGINT) or stopped it (SIGTSTP): now
# harmless, so this honest program passes
POKE_THE_HARNESS = """
import os, signal
k = int(input())
for s in (signal.SIGINT, signal.SIGALRM, signal.SIGTERM, signal.SIGHUP, signal.SIGTSTP,
          signal.SIGUSR1, signal.SIGTTIN):
    os.kill(os.getppid(), s)
print(k * k)
"""


async def test_a_stopped_harness_costs_only_its_own_test(service: LocalService) -> None:
    """The old grader's stopped harness held the batch's call to its end (14 s here, up to
    120 s) and every test of it was lost; now test 0 costs its own budget, 1 + 3 s."""
    sb = ServiceSandbox(service.url, retries=0)
    tests = squares(3)

    async def timed(code: str) -> tuple[float, GradeResult]:
        t0 = time.monotonic()
        res = await grade(sb, code, tests, timeout_s=1.0)
        return time.monotonic() - t0, res

    (elapsed, stopped), (_, poked) = await asyncio.gather(
        timed(STOP_THE_HARNESS), timed(POKE_THE_HARNESS)
    )
    await sb.aclose()
    assert [o.status for o in stopped.outcomes] == ["timeout", "pass", "pass"], stopped
    assert len(stopped.notes) == 1 and "no report" in stopped.notes[0], stopped.notes
    assert elapsed < 1.0 + _SLACK_S + 2 * 1.0 + 1.5, f"took {elapsed:.1f}s"
    assert poked.all_passed, poked.outcomes


# -- reports fit the output the service keeps (limits.output_bytes = 64 KB) -----------------


async def test_large_correct_answers_never_cost_tests(service: LocalService) -> None:
    """32 answers of 500 'é' each once made a batch report past 64 KB: this correct solution
    passed 18 of 32, with no note. A list of 300 floats (past the old 512-character inline
    limit) keeps its tolerance (once 0 of 1), and 1 MB of correct stdout passes."""
    sb = ServiceSandbox(service.url, retries=0)
    calls = [CallTest(call=f"f({k})", expected="é" * 500 + str(k)) for k in range(32)]
    words = await grade(sb, "def f(k):\n    return 'é' * 500 + str(k)", calls, timeout_s=1.0,
                        parallel=4)  # fmt: skip
    floats = [CallTest(call="g()", expected=[k / 3 for k in range(300)], tolerance=1e-9)]
    close = await grade(sb, "def g():\n    return [k / 3 + 1e-12 for k in range(300)]", floats)
    big = [IOTest(stdin="", expected="x" * 1_000_000 + "\n")]
    printed = await grade(sb, "print('x' * 1_000_000)", big)
    await sb.aclose()
    for res in (words, close, printed):
        assert res.all_passed and not res.notes, res


async def test_a_chunk_of_long_errors_is_its_zero_not_an_outage(service: LocalService) -> None:
    """A red-team pass: 300 tests in one batch call (timeout_s 0.19 s in a call of 60 s), each
    failing with 5,000 characters of error text, made the harness's report overflow the 64 KB
    the service keeps; judged lost 'not by the solution', twice, grade() raised
    SandboxUnavailable: the episode left its group's baseline and the group was rolled out
    again, so a policy could turn any 0 into no grade. Now every test fails, its text cut with
    a marker saying how much, and the reports' cut is noted."""
    sb = ServiceSandbox(service.url, retries=0)
    tests = [CallTest(call=f"f({k})", expected=k) for k in range(300)]
    for text in ("'x'", "'\\u00e9'", "'\\x01'"):  # ASCII, 2-byte UTF-8, a 6-byte JSON escape
        code = f"def f(k):\n    raise ValueError({text} * 5000)\n"
        res = await grade(sb, code, tests, timeout_s=0.19, max_call_s=60.0, batch=True)
        assert res.passed == 0 and res.total == 300 and res.tampered == 0, (text, res.notes)
        assert {o.status for o in res.outcomes} == {"error"}, (text, res.outcomes[0])
        assert all("more characters cut]" in o.detail for o in res.outcomes), res.outcomes[-1]
        assert any("cut to their share" in n for n in res.notes), res.notes
    honest = await grade(sb, "def f(k):\n    return k", tests, timeout_s=0.19, max_call_s=60.0,
                         batch=True)  # fmt: skip
    await sb.aclose()
    assert honest.all_passed and not honest.notes, honest.notes


class LossySandbox:
    """A real sandbox whose first `lose` calls keep only the first `keep` bytes of stdout: a
    service with a tiny limits.output_bytes, or a report lost on the way."""

    def __init__(self, url: str, lose: int, keep: int) -> None:
        self.inner = ServiceSandbox(url, retries=0)
        self.lose, self.keep = lose, keep

    async def run(self, code: str, language: str = "python", timeout: float = 10.0,
                  session: str | None = None) -> ExecResult:  # fmt: skip
        res = await self.inner.run(code, language, timeout, session)
        if self.lose > 0:
            self.lose -= 1
            res = res.model_copy(update={"stdout": res.stdout[: self.keep], "truncated": True})
        return res

    async def close_session(self, session: str) -> None:
        await self.inner.close_session(session)

    async def aclose(self) -> None:
        await self.inner.aclose()


async def test_a_lost_report_is_noted_and_run_again_not_counted(service: LocalService) -> None:
    tests = [CallTest(call="f()", expected="y" * 2000)]
    once = LossySandbox(service.url, lose=1, keep=1000)  # the full report: ~2.2 KB
    res = await grade(once, "def f():\n    return 'y' * 2000", tests)
    assert res.all_passed and "run again" in res.notes[0], res
    always = LossySandbox(service.url, lose=99, keep=60)  # not even a compact report fits
    with pytest.raises(SandboxUnavailable, match="lost twice"):
        await grade(always, "def f():\n    return 'y' * 2000", tests)
    await once.aclose()
    await always.aclose()
    huge = "x = 1\n" * 200_000 + "def f():\n    return 'y' * 2000"  # over max_code_bytes
    sb = ServiceSandbox(service.url, retries=0)
    res = await grade(sb, huge, tests)  # the solution's own outcome, not the sandbox's
    await sb.aclose()
    assert res.outcomes[0].status == "error" and "code_size" in res.notes[0], res
    down = ServiceSandbox("http://127.0.0.1:9", retries=0)  # nothing listens: infrastructure
    with pytest.raises(SandboxUnavailable):
        await grade(down, "def f():\n    return 1", tests)
    await down.aclose()
