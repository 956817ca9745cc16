"""A value the solution sends back is compared here without raising, whatever number it holds:
on the subprocess backend, through grade()."""

from __future__ import annotations

import pytest

from agentrl.sandbox import SubprocessSandbox
from agentrl.sandbox.checks import same_value
from agentrl.sandbox.grader import CallTest, asserts_to_tests, grade

# the solution writes its own report (the call runner's result fd is its process's): report k
# of REPORTS for the call `f(k)`
FORGED = """
import os, sys
k = int(sys.argv[3].split("(")[1].split(")")[0])
os.write(int(sys.argv[5]), (REPORTS[k] + "\\n").encode())
os._exit(0)
"""
REPORTS = [
    '{"v": ' + "9" * 400 + "}",  # an int past float's range
    '{"v": -' + "9" * 400 + "}",
    '{"v": {"__complex__": [' + "9" * 400 + ", 0]}}",
    '{"v": {"__float__": ' + "9" * 400 + "}}",
    '{"v": {"__tuple__": [' + "9" * 400 + "]}}",
    '{"v": Infinity}',
    '{"v": NaN}',
]


@pytest.mark.parametrize(
    "test",
    [
        CallTest(call="", expected=2.5, tolerance=1e-6),
        CallTest(call="", expected=2.5, rel_tolerance=1e-6),
        CallTest(call="", expected=(2.5,), tolerance=1e-6),
        CallTest(call="", expected=True, method="is_integer"),
        *asserts_to_tests("import math\nassert math.isclose(f(0), 2.5)"),
    ],
    ids=["tolerance", "rel_tolerance", "tuple", "method", "isclose"],
)
async def test_a_number_past_floats_range_is_a_wrong_answer_not_a_crash(test: CallTest) -> None:
    """A red-team pass: `return 10**400` where a tolerance was given made the grader's
    math.isclose raise OverflowError in the trainer (and `{"__complex__": [10**400, 0]}` the
    method check's complex()): the reward raised, the episode was a reward_error, a crash that
    counts toward stopping the run as the env's bug, where the policy had only answered wrong."""
    tests = [test.model_copy(update={"call": f"f({k})"}) for k in range(len(REPORTS))]
    solution = f"REPORTS = {REPORTS!r}\n" + FORGED
    res = await grade(SubprocessSandbox(), solution, tests, timeout_s=2.0, parallel=4)
    assert res.passed == 0 and {o.status for o in res.outcomes} == {"wrong"}
    if test.method is None:  # the honest answer still passes
        right = f"def f(k):\n    return {test.expected!r}"
        honest = await grade(SubprocessSandbox(), right, tests[:1], timeout_s=2.0)
        assert honest.all_passed


def test_huge_ints_compare_exactly_within_a_tolerance() -> None:
    big = 10**400
    assert same_value(big + 1, big, 2.0) and not same_value(big + 3, big, 2.0)
    assert same_value(big + 10**390, big, None, 1e-9) and not same_value(2 * big, big, None, 0.1)
    assert not same_value(big, 2.5, 1e6) and not same_value(float("inf"), big, 1.0)
