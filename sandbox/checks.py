"""What the grader runs: `IOTest` and `CallTest`, and `asserts_to_tests`, which turns
`assert f(x) == y`-style test code into CallTests whose expected values stay outside the sandbox
(agentrl/sandbox/grader.py runs and judges them; it re-exports these names).

Nothing here runs model text: test code is read with `ast`, expected values with
`ast.literal_eval`.
"""

from __future__ import annotations

import ast
import builtins
import math
import sys
from fractions import Fraction
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator


class IOTest(BaseModel):
    """Run the solution as a program with `stdin`; its stdout must equal `expected`
    (trailing spaces on each line and trailing blank lines ignored)."""

    model_config = ConfigDict(extra="forbid")
    stdin: str = ""
    expected: str


class CallTest(BaseModel):
    """Evaluate `call` (an expression over the solution's names; `candidate` is `entry_point`)
    and compare its value with `expected`. `match="truthy"` compares bool(value) instead.
    Numbers within `tolerance` (absolute: |got - expected| <= tolerance) or `rel_tolerance`
    (relative, as math.isclose's rel_tol) pass; with neither they must be equal. `method`
    (one of PREDICATES, with `args`): the value is a builtin's (`str`, `bytes`, `float`, a set)
    and the grader calls that type's method on it, outside the sandbox; that bit is compared
    (`f(x).startswith("ab")` is `call="f(x)", method="startswith", args=["ab"]`)."""

    model_config = ConfigDict(extra="forbid")
    call: str
    expected: Any = None
    tolerance: float | None = Field(None, ge=0)
    rel_tolerance: float | None = Field(None, ge=0)
    match: Literal["equal", "truthy"] = "equal"
    method: str | None = None
    args: list[Any] = []

    @field_validator("expected", "args")
    @classmethod
    def _comparable(cls, value: Any) -> Any:
        why = not_plain(value)
        if why:
            raise ValueError(f"the grader cannot compare an expected value holding {why}: use "
                             "plain data (None, bool, int, float, complex, str, bytes, and "
                             "lists, tuples, sets and dicts of them)")  # fmt: skip
        return value

    @field_validator("method")
    @classmethod
    def _known(cls, value: str | None) -> str | None:
        if value is not None and value not in PREDICATES:
            raise ValueError(
                f"method {value!r} is not one the grader computes: {sorted(PREDICATES)}"
            )
        return value


_TEXT = (str, bytes)
# The yes/no methods of builtin types that the grader computes itself, on the plain value the
# sandbox sent back (a set comes back as a frozenset: canon writes both alike). In the sandbox
# they were the solution's: `f(x).startswith("ab")` passed for an object whose every method
# returns True (a red-team pass).
PREDICATES: dict[str, tuple[type, ...]] = {
    **dict.fromkeys(["startswith", "endswith", "isalnum", "isalpha", "isascii", "isdigit",
                     "islower", "isspace", "istitle", "isupper"], _TEXT),
    **dict.fromkeys(["isdecimal", "isidentifier", "isnumeric", "isprintable"], (str,)),
    **dict.fromkeys(["isdisjoint", "issubset", "issuperset"], (frozenset,)),
    "is_integer": (float, int) if hasattr(int, "is_integer") else (float,),
}  # fmt: skip


_PLAIN = (type(None), bool, int, float, complex, str, bytes)


def not_plain(value: Any, depth: int = 0) -> str | None:
    """What in `value` the grader's `canon` could only tag by its type's name (None: nothing).
    Such a part would match any object whose type has that name (a red-team solution returned
    an instance of its own `class bytes: pass` where a bytes value was expected, and passed)."""
    if depth > 50:
        return "a nesting over 50 deep"
    t = type(value)
    if t in _PLAIN:
        return None
    if t is dict:
        parts = [x for kv in value.items() for x in kv]
    elif t in (list, tuple, set, frozenset):
        parts = list(value)
    elif t.__module__ == "numpy" and hasattr(value, "tolist"):
        parts = [value.tolist()]
    else:
        return f"a {t.__name__}"
    return next((w for x in parts if (w := not_plain(x, depth + 1))), None)


def _decoded(v: Any) -> Any:
    """The plain value a canonical one (grader.canon) stands for; ValueError for an opaque one."""
    if isinstance(v, list):
        return [_decoded(x) for x in v]
    if not isinstance(v, dict):
        return v
    ((tag, inner),) = v.items()
    if tag == "__bytes__":
        return bytes.fromhex(inner)
    if tag == "__float__":
        return float(inner)
    if tag == "__complex__":
        return complex(*map(_decoded, inner))
    if tag in ("__tuple__", "__set__"):
        return (tuple if tag == "__tuple__" else frozenset)(map(_decoded, inner))
    if tag == "__dict__":
        return {_decoded(k): _decoded(x) for k, x in inner}
    raise ValueError(f"not a plain value: {tag} {inner!r:.40}")


def method_result(test: CallTest, value: Any) -> bool | None:
    """`test.method` of the builtin type it belongs to, called here on the canonical `value` the
    sandbox sent back, with `test.args`; None when `value` is not of that exact type."""
    try:
        plain = _decoded(value)
    except (ValueError, TypeError, OverflowError, RecursionError):  # 10**400 as a float
        return None
    if test.method is None or type(plain) not in PREDICATES[test.method]:
        return None
    try:
        got = getattr(type(plain), test.method)(plain, *test.args)
    except (TypeError, ValueError, OverflowError):  # wrong argument types for the value's type
        return None
    return got if type(got) is bool else None


def same_value(got: Any, exp: Any, tol: float | None, rel: float | None = None) -> bool:
    """`tol` absolute, `rel` relative; each applies as itself only (an absolute bound taken as a
    relative one too passed 0 for `abs(f(x) - 100) < 1`: |0 - 100| <= 1 * 100)."""
    if isinstance(exp, dict) and "__opaque__" in exp:  # says only its type's name: never equal
        return False
    if isinstance(exp, bool) or isinstance(got, bool):
        return type(got) is type(exp) and got == exp
    if isinstance(exp, int | float) and isinstance(got, int | float):
        if tol is None and rel is None:
            return got == exp
        return _close(got, exp, tol or 0.0, rel or 0.0)
    if isinstance(exp, list) and isinstance(got, list):
        return len(got) == len(exp) and all(
            same_value(g, e, tol, rel) for g, e in zip(got, exp, strict=True)
        )
    if isinstance(exp, dict) and isinstance(got, dict):
        return got.keys() == exp.keys() and all(same_value(got[k], exp[k], tol, rel) for k in exp)
    return type(got) is type(exp) and got == exp


def _close(got: float, exp: float, tol: float, rel: float) -> bool:
    """math.isclose, also for an int past float's range (the solution's `10**400`, on which
    isclose raised OverflowError in the trainer: a reward_error, a crash counted as the env's
    bug), computed exactly there."""
    try:
        return math.isclose(got, exp, rel_tol=rel, abs_tol=tol)
    except OverflowError:
        if any(isinstance(x, float) and not math.isfinite(x) for x in (got, exp)):
            return False  # nan or ±inf is close to no int
        a, b = Fraction(got), Fraction(exp)
        return abs(a - b) <= max(Fraction(rel) * max(abs(a), abs(b)), Fraction(tol))


# -- assert-style tests -> CallTests ------------------------------------------------------


def _literal(node: ast.expr) -> tuple[bool, Any]:
    """(True, its value) for a literal the grader can compare (not `...`), else (False, None)."""
    try:
        value = ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return False, None
    return (False, None) if not_plain(value) else (True, value)


def _from_assert(test: ast.expr) -> CallTest | None:
    if isinstance(test, ast.Compare) and len(test.ops) == 1:
        left, op, right = test.left, test.ops[0], test.comparators[0]
        if isinstance(op, ast.Eq | ast.Is):
            for call, lit in ((left, right), (right, left)):
                ok, value = _literal(lit)
                if ok and not _literal(call)[0]:
                    return CallTest(call=ast.unparse(call), expected=value)
        if isinstance(op, ast.Lt | ast.LtE) and isinstance(left, ast.Call):
            # abs(CALL - LIT) < TOL
            ok_tol, tol = _literal(right)
            ok_tol = ok_tol and isinstance(tol, int | float) and tol >= 0
            if getattr(left.func, "id", None) == "abs" and ok_tol and len(left.args) == 1:
                diff = left.args[0]
                if isinstance(diff, ast.BinOp) and isinstance(diff.op, ast.Sub):
                    ok, value = _literal(diff.right)
                    if ok:
                        return CallTest(call=ast.unparse(diff.left), expected=value, tolerance=tol)
        return None
    if isinstance(test, ast.Call) and ast.unparse(test.func) in ("math.isclose", "isclose"):
        if len(test.args) == 2:
            ok, value = _literal(test.args[1])
            kw = {k.arg: _literal(k.value)[1] for k in test.keywords}
            rel, tol = kw.get("rel_tol", 1e-9), kw.get("abs_tol", 0.0)  # math.isclose's defaults
            numbers = all(isinstance(t, int | float) and t >= 0 for t in (rel, tol))
            if ok and numbers:
                return CallTest(call=ast.unparse(test.args[0]), expected=value,
                                tolerance=tol, rel_tolerance=rel)  # fmt: skip
        return None
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        return CallTest(call=ast.unparse(test.operand), expected=False, match="truthy")
    if isinstance(test, ast.Call | ast.Name | ast.Attribute | ast.Subscript):
        return CallTest(call=ast.unparse(test), expected=True, match="truthy")
    return None


_BUILTINS = frozenset(dir(builtins))
# Modules a test reaches by name: the standard library's, and the usual third-party ones under
# their usual aliases. A fixed list: what a test may assert must not depend on what is installed.
_MODULES = frozenset(sys.stdlib_module_names) | {
    "np", "numpy", "pd", "pandas", "scipy", "sympy", "torch", "tf", "jax", "jnp", "nx", "networkx",
}  # fmt: skip


def _decided_inside(test: CallTest) -> str | None:
    """Why the sandbox, not the grader, would decide `test`'s outcome (None: it does not). A
    comparison in the call runs there, answered by the solution's objects (`__eq__` always
    True); a yes/no test whose bit comes from a builtin or a library function (`math.isfinite`,
    `np.allclose`) gets the solution's own `isinstance`, `all`, `math`, … (names it rebinds,
    modules it patches on import, or objects that lie to them: `__float__`, `__len__`). The
    call runs in the solution's interpreter, which can also write its report itself, so no
    binding taken before the solution loads would hold: such a bit is never asked of it."""
    expr = ast.parse(test.call, mode="eval")
    for node in ast.walk(expr):
        if isinstance(node, ast.Compare):
            return f"`{ast.unparse(node)[:40]}` would be compared in the sandbox"
    if test.match == "truthy" or isinstance(test.expected, bool):
        for node in ast.walk(expr):
            name = node.func if isinstance(node, ast.Call) else None
            if isinstance(name, ast.Name) and name.id in _BUILTINS:
                return f"its yes/no would come from `{name.id}` in the sandbox"
            if isinstance(name, ast.Attribute) and (
                _module_of(name) in _MODULES | _BUILTINS or name.attr in PREDICATES
            ):  # `.startswith` here: one `_split_method` could not take out of the sandbox
                return f"its yes/no would come from `{ast.unparse(name)}` in the sandbox"
    return None


def _split_method(test: CallTest) -> CallTest:
    """A yes/no from a builtin type's method on the solution's value, with literal arguments
    (`f(x).startswith("ab")`, `not f(x).isdigit()`), as the test of that value whose method
    the grader calls itself (CallTest.method); any other test as it is."""
    node = ast.parse(test.call, mode="eval").body
    yes_no = test.match == "truthy" or isinstance(test.expected, bool)
    if not (yes_no and isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
        return test
    func, args = node.func, [_literal(a) for a in node.args]
    if func.attr not in PREDICATES or node.keywords or not all(ok for ok, _ in args):
        return test
    if _module_of(func) in _MODULES | _BUILTINS:  # `str.isdigit(f(x))`: refused as it is
        return test
    return CallTest(call=ast.unparse(func.value), expected=test.expected, match=test.match,
                    method=func.attr, args=[v for _, v in args])  # fmt: skip


def _module_of(func: ast.Attribute) -> str | None:
    """The name a dotted callee starts from (`os` of `os.path.isfile`); None when it starts
    from a value (`Stack().is_empty`)."""
    node: ast.expr = func
    while isinstance(node, ast.Attribute):
        node = node.value
    return node.id if isinstance(node, ast.Name) else None


def _bound(tree: ast.AST) -> set[str]:
    """The names `tree` binds: assigned, loop and `as` targets, parameters, defs, imports."""
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            out.add(node.id)
        elif isinstance(node, ast.arg):
            out.add(node.arg)
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            out.add(node.name)
        elif isinstance(node, ast.Import | ast.ImportFrom):
            out.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, ast.ExceptHandler) and node.name:
            out.add(node.name)
    return out


def _test_names_in(call: str, test_names: set[str]) -> list[str]:
    """The names of the test code's own (not `candidate`) that `call` reads: the sandbox never
    gets the test code, so there they are the solution's to define, or undefined."""
    expr = ast.parse(call, mode="eval")
    used = {n.id for n in ast.walk(expr) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
    return sorted((used - _bound(expr)) & (test_names - {"candidate"}))


def asserts_to_tests(test_code: str, strict: bool = True) -> list[CallTest]:
    """Turn `assert f(x) == y`-style tests (top level or inside `def check(candidate)`) into
    CallTests whose expected values stay outside the sandbox. Asserts of other shapes raise
    ValueError (strict) or are skipped, and so do those the sandbox would decide: a comparison
    inside the call (`assert all([f(1) == 2])`, `assert (f(1) == 2) is True`) or a yes/no from
    a builtin or a library (`assert isinstance(f(1), int)`, `assert math.isfinite(f(1))`), which
    the solution's objects, names and patched modules answer;
    and a call that reads a name of the test code's own (a helper, a local, an import;
    `candidate` is the solution's), which the sandbox never gets. A yes/no from a builtin
    type's method with literal arguments (`assert f(1).startswith("a")`) is graded: the grader
    calls `str.startswith` itself on the value (CallTest.method); other such calls are refused."""
    tree = ast.parse(test_code)
    test_names = _bound(tree)
    out, bad = [], []
    for node in ast.walk(tree):
        if isinstance(node, ast.Assert):
            t = _from_assert(node.test)
            t = None if t is None else _split_method(t)
            why = None if t is None else _decided_inside(t)
            if t is not None and not why and (names := _test_names_in(t.call, test_names)):
                why = f"reads {', '.join(names)}, which the test code defines: not in the sandbox"
            if t is None or why:
                bad.append(
                    f"line {node.lineno}: {ast.unparse(node.test)[:80]}"
                    + (f" ({why})" if why else "")
                )
            else:
                out.append(t)
    if bad and strict:
        raise ValueError(
            "asserts that cannot be graded outside the sandbox (use `f(x) == literal`, "
            "`abs(f(x) - v) < tol`, `math.isclose`, or pass strict=False): " + "; ".join(bad)
        )
    if not out:
        raise ValueError("no gradable asserts found in the test code")
    return out
