"""grade() says which tests the solution interfered with (Outcome.tampered, GradeResult.tampered),
and only those: on the subprocess backend."""

from __future__ import annotations

import pytest

from agentrl.sandbox import SubprocessSandbox
from agentrl.sandbox.grader import CallTest, grade

RESULT_FD = "import os, sys\nfd = int(sys.argv[5])\n"
TAMPERING = {
    "more results": RESULT_FD + "os.write(fd, b'{\"v\": 1}\\n' * 3)\nos._exit(0)\n",
    "unreadable": RESULT_FD + "os.write(fd, b'all tests passed\\n' * 2)\nos._exit(0)\n",
    "not a result": RESULT_FD + "os.write(fd, b'{\"ok\": true}\\n' * 2)\nos._exit(0)\n",
    "kills the harness": "import os, signal\nos.kill(os.getppid(), signal.SIGKILL)\n",
}
HONEST_FAILURES = {
    "wrong": "def f():\n    return 2",
    "raises": "def f():\n    raise ValueError('no')",
    "exits": "import sys\nsys.exit(0)",
    "hangs": "def f():\n    while True:\n        pass",
}


@pytest.mark.parametrize("batch", [False, True])
async def test_a_solution_that_attacks_its_grader_is_said_to(batch: bool) -> None:
    """A red-team pass: forged results on the call runner's fd and a killed harness failed
    their tests, but grade() reported them as any failure (`error`, `missing`), and the SWE
    env's components as a fix that did not work: a policy learning to attack its grader was
    not visible in a run's metrics. Honest failures are never said to tamper."""
    tests = [CallTest(call="f()", expected=1), CallTest(call="f()", expected=1)]
    sb = SubprocessSandbox()
    for name, code in TAMPERING.items():
        res = await grade(sb, code, tests, timeout_s=2.0, parallel=2, batch=batch)
        assert res.passed == 0 and res.tampered == 2, (name, res)
    for name, code in HONEST_FAILURES.items():
        res = await grade(sb, code, tests, timeout_s=1.0, parallel=2, batch=batch)
        assert res.passed == 0 and res.tampered == 0, (name, res)
    honest = await grade(sb, "def f():\n    return 1", tests, timeout_s=2.0, batch=batch)
    assert honest.all_passed and honest.tampered == 0
