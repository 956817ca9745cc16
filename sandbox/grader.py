"""Grade model-written code against tests, in a sandbox, in a way cheap reward hacks do not pass.

    from sandbox.grader import CallTest, IOTest, grade, asserts_to_tests

    tests = asserts_to_tests("assert add(1, 2) == 3\\nassert add(-1, 1) == 0")
    res = await grade(sandbox, "def add(a, b):\\n    return a + b", tests)
    res.score                                  # 1.0
    await grade(sandbox, stdin_program, [IOTest(stdin="3 4\\n", expected="7\\n")])

Why hacks fail:

- Expected answers never enter the sandbox. Inside it, a harness runs the solution in separate
  child processes and reports only what the solution produced (a value, or the sha256 of its
  normalised stdout); the comparison with the expected answer happens here, on plain JSON data.
  To make a test pass the code must produce the right answer: printing "all tests passed",
  exiting early with status 0, patching `assert`/builtins/`sys.exit`, rewriting files, or
  returning an object whose `__eq__` is always True all leave no right answer behind.
- The harness is not the solution's process: it starts each solution as a fresh interpreter
  (which never sees the per-run random nonce that marks real harness reports), marks itself
  non-dumpable (no /proc/<pid>/mem or fd access), and bounds every test with a timeout.
  A solution can kill the harness or flood the output: its tests then count as failed.
- Nothing here `eval`s or `exec`s model text in the trainer: test expressions are parsed with
  `ast` and their expected values read with `ast.literal_eval`; results are read with `json`.

Limits: each test gets `timeout_s`; values are compared type-strictly (a tuple is not a list,
True is not 1; ints and floats compare numerically, with `tolerance` when given).
"""

from __future__ import annotations

import ast
import hashlib
import inspect
import json
import math
import secrets
from collections.abc import Sequence
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from sandbox.base import Sandbox

_INLINE = 512  # values whose JSON is shorter travel as values (tolerance works), else as hashes
_BATCH = 32


class IOTest(BaseModel):
    """Run the solution as a program with `stdin`; its stdout must equal `expected`
    (trailing spaces on each line and trailing blank lines ignored)."""

    model_config = ConfigDict(extra="forbid")
    stdin: str = ""
    expected: str


class CallTest(BaseModel):
    """Evaluate `call` (an expression over the solution's names; `candidate` is `entry_point`)
    and compare its value with `expected`. `match="truthy"` compares bool(value) instead."""

    model_config = ConfigDict(extra="forbid")
    call: str
    expected: Any = None
    tolerance: float | None = None
    match: Literal["equal", "truthy"] = "equal"


class Outcome(BaseModel):
    index: int
    passed: bool
    status: Literal["pass", "wrong", "error", "timeout", "missing"]
    detail: str = ""


class GradeResult(BaseModel):
    passed: int
    total: int
    outcomes: list[Outcome]
    notes: list[str] = []

    @property
    def score(self) -> float:
        return self.passed / self.total if self.total else 0.0

    @property
    def all_passed(self) -> bool:
        return self.total > 0 and self.passed == self.total


# -- canonical values (the same function runs in the sandbox, embedded in the harness) ------


def canon(v, depth=0):
    """A JSON-able, type-tagged form of a plain value; anything else becomes an opaque tag."""
    t = type(v)
    if depth > 50:
        return {"__opaque__": "too deep"}
    if v is None or t in (bool, int, str):
        return v
    if t is float:
        return v if v == v and v not in (float("inf"), float("-inf")) else {"__float__": repr(v)}
    if t is list:
        return [canon(x, depth + 1) for x in v]
    if t is tuple:
        return {"__tuple__": [canon(x, depth + 1) for x in v]}
    if t in (set, frozenset):
        items = [canon(x, depth + 1) for x in v]
        return {"__set__": sorted(items, key=lambda x: __import__("json").dumps(x, sort_keys=True))}
    if t is dict:
        items = [[canon(k, depth + 1), canon(x, depth + 1)] for k, x in v.items()]
        return {
            "__dict__": sorted(
                items, key=lambda kv: __import__("json").dumps(kv[0], sort_keys=True)
            )
        }
    if t.__module__ == "numpy" and hasattr(v, "tolist"):
        return canon(v.tolist(), depth + 1)
    return {"__opaque__": t.__name__}


def _dumps(v: Any) -> str:
    return json.dumps(v, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def normalize_output(text: str) -> str:
    lines = [line.rstrip() for line in text.replace("\r\n", "\n").split("\n")]
    while lines and not lines[-1]:
        lines.pop()
    return "\n".join(lines)


# -- the harness (runs inside the sandbox; never sees expected answers) --------------------

_HARNESS = r"""
import ctypes, hashlib, json, os, signal, subprocess, sys, tempfile
SPEC = json.loads(__SPEC__)
NONCE = SPEC.pop("nonce")
try:
    ctypes.CDLL(None).prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE 0: children can't read our memory
    ctypes.CDLL(None).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER: daemons stay our children
except Exception:
    pass
REAL_OUT = os.dup(1)
os.dup2(os.open(os.devnull, os.O_WRONLY), 1)
WORK = tempfile.mkdtemp(prefix="h-")
SOL = os.path.join(WORK, "solution.py")
with open(SOL, "w") as f:
    f.write(SPEC["solution"])
PATHS = json.dumps([p for p in sys.path if p])

IO_RUNNER = "import json,runpy,sys;sys.path.extend(json.loads(sys.argv[2]));sys.argv=[sys.argv[1]];runpy.run_path(sys.argv[0],run_name='__main__')"
CALL_RUNNER = __CALL_RUNNER__

def emit(rec):
    os.write(REAL_OUT, ("\n" + NONCE + " " + json.dumps(rec) + "\n").encode())

def normalize(text):
    lines = [line.rstrip() for line in text.replace("\r\n", "\n").split("\n")]
    while lines and not lines[-1]:
        lines.pop()
    return "\n".join(lines)

def reap_all():
    # kill every descendant left (a daemon that left the process group and the session is
    # re-parented to us, the subreaper), until none is left
    me = os.getpid()
    for _ in range(100):
        kids = []
        for pid in os.listdir("/proc"):
            if not pid.isdigit():
                continue
            try:
                with open("/proc/%s/stat" % pid, "rb") as f:
                    stat = f.read()
                if int(stat[stat.rindex(b")") + 2:].split()[1]) == me:
                    kids.append(int(pid))
            except (OSError, ValueError):
                pass
        if not kids:
            return
        for pid in kids:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        for pid in kids:
            try:
                os.waitpid(pid, 0)
            except OSError:
                pass

def child(argv, stdin_text, timeout, pass_fds=(), keep_stdout=True):
    cwd = tempfile.mkdtemp(prefix="t-")  # a fresh directory per test
    inp = tempfile.TemporaryFile()
    inp.write(stdin_text.encode()); inp.seek(0)
    out = tempfile.TemporaryFile() if keep_stdout else open(os.devnull, "wb")
    err = tempfile.TemporaryFile()
    env = dict(os.environ, TMPDIR=cwd)
    p = subprocess.Popen(argv, stdin=inp, stdout=out, stderr=err, pass_fds=pass_fds,
                         start_new_session=True, cwd=cwd, env=env)
    try:
        rc, timed_out = p.wait(timeout), False
    except subprocess.TimeoutExpired:
        rc, timed_out = None, True
    try:
        os.killpg(p.pid, signal.SIGKILL)
    except OSError:
        pass
    p.wait()
    reap_all()
    err.seek(0)
    if not keep_stdout:
        return rc, timed_out, b"", err.read()[-300:]
    out.seek(0)
    return rc, timed_out, out.read(16 << 20), err.read()[-300:]

def run_io():
    for t in SPEC["tests"]:
        rc, to, out, err = child([sys.executable, "-I", "-S", "-c", IO_RUNNER, SOL, PATHS],
                                 t["stdin"], SPEC["timeout"])
        text = normalize(out.decode("utf-8", "replace"))
        emit({"t": t["i"], "h": hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest(),
              "p": text[:80], "rc": rc, "to": to, "e": err.decode("utf-8", "replace")[-160:]})

def run_calls():
    res = tempfile.TemporaryFile()
    calls = json.dumps([t["call"] for t in SPEC["tests"]])
    total = SPEC["timeout"] * len(SPEC["tests"]) + 5
    argv = [sys.executable, "-I", "-S", "-c", CALL_RUNNER, SOL, PATHS, calls,
            SPEC.get("entry") or "", str(res.fileno()), str(SPEC["timeout"])]
    rc, to, out, err = child(argv, "", total, pass_fds=(res.fileno(),), keep_stdout=False)
    res.seek(0)
    seen = {}
    for line in res.read(16 << 20).decode("utf-8", "replace").splitlines():
        try:
            rec = json.loads(line)
            i = int(rec["i"])
        except Exception:
            continue
        if i in seen or not 0 <= i < len(SPEC["tests"]):
            seen[i] = {"err": "more than one result"} if i in seen else None
            continue
        seen[i] = rec
    for n, t in enumerate(SPEC["tests"]):
        rec = seen.get(n)
        if rec is None:
            emit({"t": t["i"], "missing": True, "to": to, "e": err.decode("utf-8", "replace")[-160:]})
        elif "err" in rec:
            emit({"t": t["i"], "err": str(rec["err"])[:200]})
        else:
            text = json.dumps(rec.get("v"), sort_keys=True, separators=(",", ":"), ensure_ascii=False)
            frame = {"t": t["i"], "h": hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest(), "p": text[:80]}
            if len(text) <= __INLINE__:
                frame["v"] = json.loads(text)
            emit(frame)

run_io() if SPEC["kind"] == "io" else run_calls()
emit({"done": True})
"""

_CALL_RUNNER = r"""
import json, os, signal, sys
sys.path.extend(json.loads(sys.argv[2]))
calls, entry, fd, per = json.loads(sys.argv[3]), sys.argv[4], int(sys.argv[5]), float(sys.argv[6])
out = os.fdopen(fd, "w")
__CANON__
def put(rec):
    try:
        line = json.dumps(rec)
    except Exception:
        line = json.dumps({"i": rec["i"], "err": "result is not serialisable"})
    out.write(line + "\n"); out.flush()
ns = {"__name__": "solution", "__file__": sys.argv[1]}
try:
    exec(compile(open(sys.argv[1]).read(), "solution.py", "exec"), ns)
except BaseException as e:
    for i in range(len(calls)):
        put({"i": i, "err": "loading the solution failed: %s: %s" % (type(e).__name__, e)})
    os._exit(0)
if entry and entry in ns:
    ns["candidate"] = ns[entry]
class _Timeout(BaseException):
    pass
def _alarm(*a):
    raise _Timeout()
signal.signal(signal.SIGALRM, _alarm)
for i, call in enumerate(calls):
    signal.setitimer(signal.ITIMER_REAL, per)
    try:
        rec = {"i": i, "v": canon(eval(call, ns))}
    except _Timeout:
        rec = {"i": i, "err": "timeout"}
    except BaseException as e:
        rec = {"i": i, "err": ("%s: %s" % (type(e).__name__, e))[:200]}
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
    put(rec)
os._exit(0)
"""


def harness_code(kind: str, tests: list[dict], solution: str, timeout: float, nonce: str,
                 entry: str | None) -> str:  # fmt: skip
    spec = {"kind": kind, "tests": tests, "solution": solution, "timeout": timeout}
    spec.update(nonce=nonce, entry=entry)
    runner = _CALL_RUNNER.replace("__CANON__", inspect.getsource(canon))
    return (
        _HARNESS.replace("__SPEC__", repr(json.dumps(spec)))
        .replace("__CALL_RUNNER__", repr(runner))
        .replace("__INLINE__", str(_INLINE))
    )


def _frames(stdout: str, nonce: str) -> dict[int, dict]:
    out: dict[int, dict] = {}
    for line in stdout.splitlines():
        i = line.find(nonce + " ")
        if i < 0:
            continue
        try:
            rec = json.loads(line[i + len(nonce) + 1 :])
        except ValueError:
            continue
        if isinstance(rec, dict) and isinstance(rec.get("t"), int):
            out.setdefault(rec["t"], rec)
    return out


# -- comparison (plain data only) ---------------------------------------------------------


def _same(got: Any, exp: Any, tol: float | None) -> bool:
    if isinstance(exp, bool) or isinstance(got, bool):
        return type(got) is type(exp) and got == exp
    if isinstance(exp, int | float) and isinstance(got, int | float):
        return got == exp if tol is None else math.isclose(got, exp, rel_tol=tol, abs_tol=tol)
    if isinstance(exp, list) and isinstance(got, list):
        return len(got) == len(exp) and all(_same(g, e, tol) for g, e in zip(got, exp, strict=True))
    if isinstance(exp, dict) and isinstance(got, dict):
        return got.keys() == exp.keys() and all(_same(got[k], exp[k], tol) for k in exp)
    return type(got) is type(exp) and got == exp


def _truthy(v: Any) -> bool | None:
    """bool() of a canonical value; None for opaque objects (whose __bool__ is the model's)."""
    if isinstance(v, dict):
        if "__opaque__" in v:
            return None
        if "__float__" in v:
            return True
        inner = next(iter(v.values()), [])
        return bool(inner)
    return bool(v)


def _judge_call(test: CallTest, frame: dict) -> Outcome:
    exp = canon(test.expected)
    if "v" not in frame:  # large value: exact comparison through its hash
        ok = test.match == "equal" and frame.get("h") == _sha(_dumps(exp))
    elif test.match == "truthy":
        ok = _truthy(frame["v"]) is bool(test.expected)
    else:
        ok = _same(frame["v"], exp, test.tolerance)
    return Outcome(index=0, passed=ok, status="pass" if ok else "wrong",
                       detail="" if ok else f"got {frame.get('p', '')!r}")  # fmt: skip


def _judge(test: IOTest | CallTest, frame: dict | None) -> Outcome:
    if frame is None or frame.get("missing"):
        status = "timeout" if frame and frame.get("to") else "missing"
        return Outcome(index=0, passed=False, status=status,
                           detail=(frame or {}).get("e", "no result (the run ended early)"))  # fmt: skip
    if "err" in frame:
        status = "timeout" if frame["err"] == "timeout" else "error"
        return Outcome(index=0, passed=False, status=status, detail=frame["err"])
    if isinstance(test, CallTest):
        return _judge_call(test, frame)
    if frame.get("to"):
        return Outcome(index=0, passed=False, status="timeout")
    ok = frame.get("h") == _sha(normalize_output(test.expected))
    detail = (
        "" if ok else f"got {frame.get('p', '')!r} (exit {frame.get('rc')}) {frame.get('e', '')}"
    )
    return Outcome(index=0, passed=ok, status="pass" if ok else "wrong", detail=detail.strip())


async def grade(
    sandbox: Sandbox,
    solution: str,
    tests: Sequence[IOTest | CallTest],
    *,
    timeout_s: float = 5.0,
    entry_point: str | None = None,
    max_call_s: float = 120.0,
) -> GradeResult:
    """Run `solution` against `tests` in `sandbox` (one-shot runs) and score it here.
    Raises SandboxUnavailable if the sandbox is down (an infrastructure failure, not a 0).

    Tests go in batches whose time budget fits `max_call_s` (the sandbox's longest call: the
    service's `limits.max_wall_s`); a test that cannot fit is a ValueError, never a silent cut."""
    per_batch = min(_BATCH, int((max_call_s - 10.0) // timeout_s) - 1)
    if per_batch < 1:
        raise ValueError(
            f"grade(): timeout_s={timeout_s:g} per test does not fit a sandbox call of "
            f"max_call_s={max_call_s:g} (needs >= {2 * timeout_s + 10:g}); lower timeout_s or "
            "raise the sandbox's max_wall_s"
        )
    outcomes: list[Outcome] = []
    notes: list[str] = []
    kinds = {type(t) for t in tests}
    if len(kinds) > 1:
        raise ValueError("grade() takes either IOTest or CallTest items, not both")
    for start in range(0, len(tests), per_batch):
        batch = list(tests[start : start + per_batch])
        nonce = secrets.token_hex(16)
        kind = "io" if isinstance(batch[0], IOTest) else "call"
        spec = [
            {"i": i, "stdin": t.stdin} if isinstance(t, IOTest) else {"i": i, "call": t.call}
            for i, t in enumerate(batch)
        ]
        code = harness_code(kind, spec, solution, timeout_s, nonce, entry_point)
        budget = timeout_s * (len(batch) + 1) + 10.0
        res = await sandbox.run(code, language="python", timeout=budget)
        frames = _frames(res.stdout, nonce)
        if res.limit or res.timed_out:
            notes.append(f"tests {start}-{start + len(batch) - 1}: sandbox limit {res.limit}")
        for i, t in enumerate(batch):
            o = _judge(t, frames.get(i))
            outcomes.append(o.model_copy(update={"index": start + i}))
    passed = sum(o.passed for o in outcomes)
    return GradeResult(passed=passed, total=len(outcomes), outcomes=outcomes, notes=notes)


# -- assert-style tests -> CallTests ------------------------------------------------------


def _literal(node: ast.expr) -> tuple[bool, Any]:
    try:
        return True, ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return False, None


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
            tol = max(kw.get("rel_tol") or 1e-9, kw.get("abs_tol") or 0.0)
            if ok:
                return CallTest(call=ast.unparse(test.args[0]), expected=value, tolerance=tol)
        return None
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        return CallTest(call=ast.unparse(test.operand), expected=False, match="truthy")
    if isinstance(test, ast.Call | ast.Name | ast.Attribute | ast.Subscript):
        return CallTest(call=ast.unparse(test), expected=True, match="truthy")
    return None


def asserts_to_tests(test_code: str, strict: bool = True) -> list[CallTest]:
    """Turn `assert f(x) == y`-style tests (top level or inside `def check(candidate)`) into
    CallTests whose expected values stay outside the sandbox. Asserts of other shapes raise
    ValueError (strict) or are skipped."""
    tree = ast.parse(test_code)
    out, bad = [], []
    for node in ast.walk(tree):
        if isinstance(node, ast.Assert):
            t = _from_assert(node.test)
            if t is None:
                bad.append(f"line {node.lineno}: {ast.unparse(node.test)[:80]}")
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
