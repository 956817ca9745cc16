"""What the solution's output makes the grader's harness fail on is the solution's failed test,
never a lost report (which grade() runs again, then raises SandboxUnavailable: the episode out
of its group's baseline, as an outage). On the subprocess backend, through grade()."""

from __future__ import annotations

import pytest

from agentrl.sandbox import SandboxUnavailable, SubprocessSandbox
from agentrl.sandbox.grader import CallTest, IOTest, grade

# the call runner's result fd is the solution's process's: two results for one call
TWO_RESULTS = (
    'import os, sys\nos.write(int(sys.argv[5]), b\'{"v": 1}\\n{"v": 1}\\n\')\nos._exit(0)\n'
)
# output whose reading holds more than the harness's memory limit (RLIMIT_AS here)
NEWLINES = "import os\nos.write(1, b'\\n' * (16 << 20))\n"


async def test_more_results_than_calls_is_the_solutions_error_not_an_outage() -> None:
    """A red-team pass: a solution that wrote two lines to its result fd for a single CallTest
    (grade()'s default, one call per sandbox call) crashed the harness (`more results than
    calls` came back as a list where one frame was due: TypeError), its report was judged lost
    'not by the solution', and grade() raised SandboxUnavailable: the episode left its group's
    baseline as an outage and its group was rolled out again, on the local service as here."""
    tests = [CallTest(call="f()", expected=1)]
    res = await grade(SubprocessSandbox(), TWO_RESULTS, tests, timeout_s=3.0)
    assert res.passed == 0 and res.outcomes[0].status == "error"
    assert "more results than calls" in res.outcomes[0].detail


@pytest.mark.parametrize("kind", ["io", "call"])
async def test_output_the_harness_cannot_hold_fails_the_test(kind: str) -> None:
    """Under a memory limit of 256 MB per process (RLIMIT_AS: a host whose cgroups are not
    writable), 16 MB of newlines made the harness's reading raise MemoryError after the
    solution ran; that too was a lost report and SandboxUnavailable."""
    sandbox = SubprocessSandbox(memory_mb=256)
    if kind == "io":
        res = await grade(sandbox, NEWLINES, [IOTest(expected="x")], timeout_s=3.0)
    else:
        flood = "import os, sys\nos.write(int(sys.argv[5]), b'ab\\n' * (5 << 20))\nos._exit(0)\n"
        res = await grade(sandbox, flood, [CallTest(call="f()", expected=1)], timeout_s=3.0)
    assert res.passed == 0 and res.outcomes[0].status in ("error", "wrong")
    assert res.outcomes[0].status == "wrong" or "the harness failed" in res.notes[0]


class NoForkSandbox(SubprocessSandbox):
    """A sandbox at its process limit: the harness's fork of the solution is refused (EAGAIN),
    as under a full pids cgroup."""

    async def run(self, code, language="python", timeout=10.0, session=None):
        refuse = "import os\ndef _no(*a):\n    raise BlockingIOError(11, 'fork refused')\nos.fork = _no\n"
        return await super().run(refuse + code, language, timeout, session)


async def test_a_fork_the_sandbox_refuses_before_the_solution_runs_is_an_outage() -> None:
    """The harness failing before the solution's process exists is not the solution's doing:
    its report is lost and, lost twice, grade() says the sandbox is unavailable."""
    with pytest.raises(SandboxUnavailable, match="fork refused"):
        await grade(NoForkSandbox(), "def f():\n    return 1", [CallTest(call="f()", expected=1)])
