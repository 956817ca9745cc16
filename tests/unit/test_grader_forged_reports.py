"""What a solution writes as its own report (the call runner's result fd is its process's) is
judged as its answer, never raised in the trainer: on the subprocess backend."""

from __future__ import annotations

from agentrl.sandbox import SubprocessSandbox
from agentrl.sandbox.grader import CallTest, grade

DEEP_REPORT = """
import os, sys
depth = int(sys.argv[3].split("(")[1].split(")")[0])
os.write(int(sys.argv[5]), ('{"v": ' + "[" * depth + "]" * depth + "}\\n").encode())
os._exit(0)
"""


async def test_a_deeply_nested_report_is_a_wrong_answer_not_a_crash() -> None:
    """A red-team pass: a solution wrote `{"v": [[[...]]]}` about 990 deep to its result fd
    itself; the harness read it, passed it on, and the grader's json.loads raised
    RecursionError in the trainer (reward_error: the episode a crash that counts toward
    stopping the run, not the policy's 0). The depth the harness still reads but the trainer's
    deeper stack does not varies, so the test walks the edge."""
    tests = [CallTest(call=f"f({n})", expected=[1]) for n in range(880, 1001, 8)]
    res = await grade(SubprocessSandbox(), DEEP_REPORT, tests, timeout_s=2.0, parallel=4)
    assert res.passed == 0 and {o.status for o in res.outcomes} <= {"wrong", "error"}
