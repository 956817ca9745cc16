"""asserts_to_tests keeps the verdict outside the sandbox, through grade() on the subprocess
backend: an assert the sandbox would decide is refused (strict) or skipped, never graded."""

from __future__ import annotations

import pytest

from agentrl.sandbox import SubprocessSandbox
from agentrl.sandbox.checks import method_result
from agentrl.sandbox.grader import CallTest, asserts_to_tests, grade

DECIDED_INSIDE = """
def check(candidate):
    assert (candidate(2) == 4) is True
    assert all([candidate(3) == 9, candidate(4) == 16])
    assert isinstance(candidate(5), int)
    assert candidate(6) == 36
"""
ALWAYS_EQUAL = (
    "class Any:\n    def __eq__(self, other): return True\n    __hash__ = None\n"
    "isinstance = lambda *a: True\ndef candidate(x):\n    return Any()"
)


async def hack_fails_honest_passes(hack: str, tests: list) -> None:
    """`hack` passes none of `tests` in the sandbox; the honest square passes them all."""
    sb = SubprocessSandbox()
    hacked = await grade(sb, hack, tests, timeout_s=2.0)
    honest = await grade(sb, "def candidate(x):\n    return x * x", tests, timeout_s=2.0)
    assert hacked.passed == 0 and honest.all_passed


async def test_an_assert_the_sandbox_would_decide_is_not_graded() -> None:
    """A red-team pass: these asserts ran their `==` (and `isinstance`) in the sandbox, where an
    object whose __eq__ is always True and a module-level `isinstance = lambda *a: True` passed
    3 of 4 (the fourth, compared here, failed)."""
    with pytest.raises(ValueError, match="compared in the sandbox"):
        asserts_to_tests(DECIDED_INSIDE)
    tests = asserts_to_tests(DECIDED_INSIDE, strict=False)
    assert [t.call for t in tests] == ["candidate(6)"]
    await hack_fails_honest_passes(ALWAYS_EQUAL, tests)


def test_yes_no_asserts_on_the_solutions_own_value_stay() -> None:
    tests = asserts_to_tests(
        "assert candidate(1)\nassert not candidate(0)\nassert candidate(2) is True\n"
        "assert len(candidate(3)) == 3\nassert sorted(candidate([2, 1])) == [1, 2]"
    )
    assert [t.call for t in tests] == ["candidate(1)", "candidate(0)", "candidate(2)",
                                       "len(candidate(3))", "sorted(candidate([2, 1]))"]  # fmt: skip


TEST_NAMES = """
import math
def is_square(f, n):
    return f(n) == n * n
def check(candidate):
    assert is_square(candidate, 6)
    xs = 7
    assert candidate(xs) == 49
    assert math.floor(candidate(1.5)) == 2
    assert candidate(8) == 64
    assert sum(candidate(k) for k in range(3)) == 5
"""


async def test_an_assert_reading_the_test_codes_own_names_is_not_graded() -> None:
    """A red-team pass: `is_square`, `xs` and `math` belong to the test code, which the sandbox
    never gets; there they were undefined (the honest solution failed 3 of 5 with a NameError)
    or the solution's to define (`is_square = lambda *a: True` passed its check)."""
    with pytest.raises(ValueError, match="reads is_square, which the test code defines"):
        asserts_to_tests(TEST_NAMES)
    tests = asserts_to_tests(TEST_NAMES, strict=False)
    assert [t.call for t in tests] == ["candidate(8)", "sum((candidate(k) for k in range(3)))"]
    sb = SubprocessSandbox()
    honest = await grade(sb, "def candidate(x):\n    return x * x", tests, timeout_s=2.0)
    helper = await grade(sb, "is_square = lambda *a: True\ndef candidate(x):\n    return 0", tests)
    assert honest.all_passed and helper.passed == 0


LIBRARY_YES_NO = """
def check(candidate):
    assert math.isfinite(candidate(1.0))
    assert not math.isnan(candidate(2.0))
    assert candidate(3.0) == 9.0
"""
PATCHES_MATH = (
    "import math\nmath.isfinite = lambda x: True\nmath.isnan = lambda x: False\n"
    "def candidate(x):\n    return float('nan')"
)


async def test_a_yes_no_from_a_library_the_solution_can_patch_is_not_graded() -> None:
    """A red-team pass: `math` (the solution's: the test code does not import it) ran in the
    solution's interpreter, where a solution that set `math.isfinite = lambda x: True` on import
    passed both yes/no checks with a NaN for every answer."""
    with pytest.raises(ValueError, match="would come from `math.isfinite`"):
        asserts_to_tests(LIBRARY_YES_NO)
    tests = asserts_to_tests(LIBRARY_YES_NO, strict=False)
    assert [t.call for t in tests] == ["candidate(3.0)"]
    await hack_fails_honest_passes(PATCHES_MATH, tests)
    # a library's value compared here, and a method of the solution's own object, still grade
    kept = asserts_to_tests("assert math.floor(candidate(1.5)) == 2\nassert Stack().is_empty()")
    assert [t.call for t in kept] == ["math.floor(candidate(1.5))", "Stack().is_empty()"]


NAMED_LIKE = (
    "class bytes:\n    pass\nclass complex:\n    pass\n"
    "def enc(s):\n    return bytes()\ndef root(x):\n    return complex()"
)


async def test_an_expected_bytes_or_complex_value_is_compared_not_named() -> None:
    """A red-team pass: the grader wrote bytes and complex values as their type's name only, so
    `enc("hi") == b"hi"` and `root(-4) == 2j` passed for any bytes and any complex value, or
    for an instance of the solution's own `class bytes: pass` (3 of 3 with `f() == ...`)."""
    tests = asserts_to_tests('assert enc("hi") == b"hi"\nassert root(-4) == 2j')
    sb = SubprocessSandbox()
    named = await grade(sb, NAMED_LIKE, tests, timeout_s=2.0)
    other = "def enc(s):\n    return b'no'\ndef root(x):\n    return 1j"
    wrong = await grade(sb, other, tests, timeout_s=2.0)
    right = "def enc(s):\n    return s.encode()\ndef root(x):\n    return (-x) ** 0.5 * 1j"
    honest = await grade(sb, right, tests, timeout_s=2.0)
    assert named.passed == 0 and wrong.passed == 0 and honest.all_passed
    # a value it could still name only by its type is refused where the test is made
    with pytest.raises(ValueError, match="cannot be graded"):
        asserts_to_tests("assert f() == ...")
    with pytest.raises(ValueError, match="holding a object"):
        CallTest(call="f()", expected=[1, object()])
    assert asserts_to_tests("assert not enc('')")[0].match == "truthy"


METHOD_YES_NO = """
def check(candidate):
    assert candidate("Bob").startswith("Hello")
    assert candidate("Ann").strip().endswith(("Ann", "Bob"))
    assert not candidate("Cy").isdigit()
    assert candidate("Di").istitle() is True
    assert set(["Hello", "Di"]).issuperset({"Di"})
"""
EVERY_METHOD_TRUE = (
    "class Yes:\n    def __getattr__(self, name):\n        return lambda *a: name != 'isdigit'\n"
    "def candidate(name):\n    return Yes()"
)


async def test_a_yes_no_from_a_method_of_the_value_is_computed_here() -> None:
    """A red-team pass: `candidate(x).startswith("Hello")` called the returned object's own
    `startswith`, so an object whose every method returned True (False for `isdigit`, asked under
    `not`) passed 3 of 4. The method is now called here, on the plain value sent back, and only
    for that builtin's exact type."""
    tests = asserts_to_tests(METHOD_YES_NO, strict=False)
    assert [(t.call, t.method) for t in tests] == [
        ("candidate('Bob')", "startswith"), ("candidate('Ann').strip()", "endswith"),
        ("candidate('Cy')", "isdigit"), ("candidate('Di')", "istitle")]  # fmt: skip
    sb = SubprocessSandbox()
    hacked = await grade(sb, EVERY_METHOD_TRUE, tests, timeout_s=2.0)
    honest = await grade(sb, "def candidate(n):\n    return f'Hello {n}'", tests, timeout_s=2.0)
    sub = "class S(str):\n    def startswith(self, *a): return True\ndef candidate(n): return S(n)"
    subclass = await grade(sb, sub, tests[:1], timeout_s=2.0)
    assert hacked.passed == 0 and honest.all_passed and subclass.passed == 0
    # where it cannot be taken out of the sandbox, it is refused: a builtin's name the solution
    # can rebind, an argument the sandbox computes, a `not` around the method
    for refused in ("str.isdigit(candidate(1))", "candidate(1).startswith(candidate(2))",
                    "not not candidate(1).isdigit()", "str(candidate(1)).isdigit()"):  # fmt: skip
        with pytest.raises(ValueError, match="would come from"):
            asserts_to_tests(f"assert {refused}")
    # sets and floats, as canon writes them; an opaque value has no method here
    subset = CallTest(call="f()", expected=True, method="issubset", args=[{1, 2}])
    assert method_result(subset, {"__set__": [1]}) is True
    assert method_result(subset, {"__opaque__": "Yes"}) is None
    integral = CallTest(call="f()", expected=True, method="is_integer")
    assert method_result(integral, 2.0) is True and method_result(integral, "2") is None
    # an equality with a method's value is still compared here as it was
    assert asserts_to_tests("assert candidate(1).count('a') == 2")[0].method is None
