"""Grade model-written code against tests, in a sandbox, in a way cheap reward hacks do not pass.

    from agentrl.sandbox.grader import CallTest, IOTest, grade, asserts_to_tests

    tests = asserts_to_tests("assert add(1, 2) == 3\\nassert add(-1, 1) == 0")
    res = await grade(sandbox, "def add(a, b):\\n    return a + b", tests)
    res.score                                  # 1.0
    await grade(sandbox, stdin_program, [IOTest(stdin="3 4\\n", expected="7\\n")])

How a test runs: each test is its own one-shot sandbox call (on the local service: a fresh
worker with its own /tmp, PID namespace and cgroup, killed afterwards, in the grader's lane:
`base.grading`, so the policy's own calls never make it wait or busy). In it a harness starts
the solution as a fresh interpreter, its child, which for a CallTest loads the solution and
evaluates that one call. At `timeout_s` after the start (load and import included: there is no
in-solution alarm to catch) the harness kills the child, then every process of the sandbox but
itself (`kill(-1)` in the PID namespace: no fork outruns it), and only then reads what the child
left and prints one bounded report. The call's wall limit is `timeout_s` + 3 s: a harness the
solution stopped costs that test's budget, not the whole grade's.

Why hacks fail:

- Expected answers never enter the sandbox. The harness reports only what the solution produced
  (a value, or the sha256 of its normalised stdout); the comparison with the expected answer
  happens here, on plain JSON data. To make a test pass the code must produce the right answer:
  printing "all tests passed", exiting early with status 0, patching `assert`/builtins/`sys.exit`,
  rewriting files, or returning an object whose `__eq__` is always True all leave none behind.
- Nothing carries over between tests: no process, no file (each call has a fresh /tmp), no
  interpreter state. Progress saved by a test that timed out is gone when the next one starts.
- The harness is not the solution's process: it is non-dumpable (no /proc/<pid>/mem or fd
  access), ignores catchable signals, and marks its reports with a per-call nonce the solution
  never sees. A solution that kills or stops the harness, or floods, fails that test (noted;
  a kill, and results it wrote itself on the runner's fd, set `Outcome.tampered`).
- A report always fits the sandbox's output: each test of a call has its share of
  `_REPORT_BYTES` (a batch call at most `_MAX_BATCH` tests); a frame past it is cut in the
  harness, its value then compared through its hash, its texts cut with a marker saying how many
  characters went, and noted. Errors of 5,000 characters in 300 tests of a batch call once
  overflowed the 64 KB the service keeps: a report lost twice, SandboxUnavailable, a 0 made
  into no grade at the policy's will.
- A report lost not by the solution (the harness never started it, or ended normally without a
  report) is noted and the test run again with a compact report; lost twice, grade() raises
  SandboxUnavailable (an infrastructure failure, not a 0). Once the solution has started, the
  harness failing on what it left (more results than calls, output past the memory limit) is
  that test's error, noted: as a lost report it was an outage the solution could make at will.
- Nothing here `eval`s or `exec`s model text in the trainer: test expressions are parsed with
  `ast` and their expected values read with `ast.literal_eval`; results are read with `json`.

Where it holds: on the local service with bwrap (/health: mode "bwrap", private_tmp "tmpfs"),
and between tests with `isolation="rlimits"` as root (a fresh uid and private dirs per call).
On e2b each test gets an e2b sandbox of its own (the backend's grading calls). Elsewhere the
harness kills the child's session and the descendants it finds; with rlimits as a non-root user
or SubprocessSandbox (the host's /tmp), a determined solution can leave files or processes for
a later test.

Size: one module, because it is one security argument (what the harness may see, how a test
runs, how its report is judged, what a lost report means): split, its parts would each look
safe alone.

Limits: each test gets `timeout_s` of wall time; an expected value must be plain data (None,
bool, int, float, complex, str, bytes, and lists, tuples, sets and dicts of them: anything else
the harness could name only by its type, which any object of that name would match, so a
CallTest refuses it); values are compared type-strictly (a tuple is
not a list, True is not 1; ints and floats compare numerically, within `tolerance` (absolute)
or `rel_tolerance` (relative) when given: `abs(f(x) - v) < t` reads as the first, `math.isclose`
as both, with its own defaults). A yes/no from a builtin's method (`f(x).startswith("a")`:
CallTest.method) is computed here on the value sent back, which must fit the inline report.
"""

from __future__ import annotations

import asyncio
import hashlib
import inspect
import json
import re
import secrets
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel

from agentrl.sandbox.base import ExecResult, Sandbox, SandboxUnavailable, grading
from agentrl.sandbox.checks import CallTest, IOTest, asserts_to_tests, method_result
from agentrl.sandbox.checks import same_value as _same
from agentrl.tool import gather_all

__all__ = ["CallTest", "GradeResult", "IOTest", "Outcome", "asserts_to_tests", "grade"]

_INLINE = 8192  # values whose JSON is shorter travel as values (tolerance works), else as hashes
# A call's report: its frames share _REPORT_BYTES (with the start record, under the 64 KiB of
# stdout the sandbox keeps), each test at least _FRAME_BYTES, a frame whose texts are cut with a
# marker (its value then travels as a hash); so a batch call holds at most _MAX_BATCH tests. A
# retry's frame (compact) holds at most _COMPACT_BYTES.
_REPORT_BYTES = 48_000
_FRAME_BYTES = 192
_MAX_BATCH = _REPORT_BYTES // _FRAME_BYTES
_COMPACT_BYTES = 256
_SLACK_S = 3.0  # a call's wall limit beyond timeout_s: the harness's start (half) and clean-up


class Outcome(BaseModel):
    index: int
    passed: bool
    status: Literal["pass", "wrong", "error", "timeout", "missing"]
    detail: str = ""
    # the solution interfered with the grader: it wrote results of its own (unreadable, or more
    # than its calls) where the call runner writes its report, or a signal killed the harness
    # (no sandbox limit, no timeout). Failed either way; said so that a run can show it.
    tampered: bool = False


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

    @property
    def tampered(self) -> int:
        """Tests whose grading the solution interfered with (`Outcome.tampered`)."""
        return sum(o.tampered for o in self.outcomes)


# -- canonical values (the same functions run in the sandbox, embedded in the harness) -----


def canon(v, depth=0):
    """A JSON-able, type-tagged form of a plain value; anything else becomes an opaque tag."""
    t = type(v)
    if depth > 50:
        return {"__opaque__": "too deep"}
    if v is None or t in (bool, int, str):
        return v
    if t is float:
        return v if v == v and v not in (float("inf"), float("-inf")) else {"__float__": repr(v)}
    if t is bytes:
        return {"__bytes__": v.hex()}
    if t is complex:
        return {"__complex__": [canon(v.real, depth + 1), canon(v.imag, depth + 1)]}
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


def _truthy(v):
    """bool() of a canonical value; None for opaque objects (whose __bool__ is the model's)."""
    if isinstance(v, dict):
        if "__opaque__" in v:
            return None
        if "__float__" in v:
            return True
        inner = next(iter(v.values()), [])
        if "__complex__" in v and isinstance(inner, list):
            return any(x != 0 for x in inner)
        return bool(inner)
    return bool(v)


def _dumps(v: Any) -> str:
    return json.dumps(v, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def clip(text: str, keep: int) -> str:
    """`text` cut to `keep` characters and a marker saying how many went (an earlier cut's
    marker, the call runner's, is counted in and replaced). Runs in the harness and the call
    runner (their source is built from this one), so both write one marker."""
    m = re.search(r" \[(\d+) more characters cut\]$", text)
    body, before = (text[: m.start()], int(m.group(1))) if m else (text, 0)
    if keep >= len(body):
        return text
    return f"{body[:keep]} [{len(body) - keep + before} more characters cut]"


def normalize_output(text: str) -> str:
    lines = [line.rstrip() for line in text.replace("\r\n", "\n").split("\n")]
    while lines and not lines[-1]:
        lines.pop()
    return "\n".join(lines)


# -- the harness (runs inside the sandbox, one test per call; never sees expected answers) -

_HARNESS = (Path(__file__).parent / "_harness.py").read_text()  # a template

# The program of an IOTest: the solution as __main__, site-packages on the path.
_IO_RUNNER = (
    "import runpy,sys;sys.path.extend(p for p in sys.argv[2].split('\\n') if p);"
    "sys.argv=[sys.argv[1]];runpy.run_path(sys.argv[0],run_name='__main__')"
)

# The program of CallTests: load the solution, evaluate each call (a JSON list: one, or a batch)
# in order, write one JSON line per call to the result fd. The harness kills this process at the
# deadline; nothing in here times itself.
_CALL_RUNNER = r"""
import json, os, re, sys
sys.path.extend(p for p in sys.argv[2].split("\n") if p)
calls, entry, out = json.loads(sys.argv[3]), sys.argv[4], os.fdopen(int(sys.argv[5]), "w")
__CANON__
__CLIP__
ns = {"__name__": "solution", "__file__": sys.argv[1]}
try:
    exec(compile(open(sys.argv[1]).read(), "solution.py", "exec"), ns)
    loaded = None
except BaseException as e:
    loaded = {"err": clip("loading the solution failed: %s: %s" % (type(e).__name__, e), 200)}
if entry and entry in ns:
    ns["candidate"] = ns[entry]
for call in calls:
    if loaded is not None:
        rec = loaded
    else:
        try:
            rec = {"v": canon(eval(call, ns))}
        except BaseException as e:
            rec = {"err": clip("%s: %s" % (type(e).__name__, e), 200)}
    try:
        line = json.dumps(rec)
    except BaseException:
        line = json.dumps({"err": "result is not serialisable"})
    out.write(line + "\n")
    out.flush()
os._exit(0)
"""


def harness_code(test: dict, kind: str, solution: str, timeout: float, nonce: str,
                 entry: str | None, compact: bool = False,
                 files: dict[str, str] | None = None,
                 inline: int | None = None) -> str:  # fmt: skip
    """The program of one sandbox call: run the solution on `test` ({"i", "stdin"|"call"}).
    `compact`: a report of a few hundred bytes (values as hashes only). `files`: a repository
    (relative path -> text) written where the solution runs, first on its import path."""
    if isinstance(test["i"], list) and not 0 < len(test["i"]) <= _MAX_BATCH:
        raise ValueError(f"harness_code(): a call runs 1 to {_MAX_BATCH} tests (their reports "
                         f"must fit the sandbox's output), not {len(test['i'])}")  # fmt: skip
    spec = {"kind": kind, "test": test, "solution": solution, "timeout": timeout}
    spec.update(nonce=nonce, entry=entry, compact=compact, files=files or {}, inline=inline)
    runner = _CALL_RUNNER.replace("__CANON__", inspect.getsource(canon))
    runner = runner.replace("__CLIP__", inspect.getsource(clip))
    return (
        _HARNESS.replace("__SPEC__", repr(json.dumps(spec, ensure_ascii=False)))
        .replace("__IO_RUNNER__", repr(_IO_RUNNER))
        .replace("__CALL_RUNNER__", repr(runner))
        .replace(
            "__HELPERS__", "".join(map(inspect.getsource, (_truthy, _sha, clip, normalize_output)))
        )
        .replace("__INLINE__", str(_INLINE))
        .replace("__REPORT_BYTES__", str(_REPORT_BYTES))
        .replace("__COMPACT_BYTES__", str(_COMPACT_BYTES))
        .replace("__START_S__", str(_SLACK_S / 2))
    )


def _records(stdout: str, nonce: str) -> list[dict]:
    out = []
    for line in stdout.splitlines():
        i = line.find(nonce + " ")
        if i < 0:
            continue
        try:
            rec = json.loads(line[i + len(nonce) + 1 :])
        except ValueError:
            continue
        if isinstance(rec, dict):
            out.append(rec)
    return out


def _frames(stdout: str, nonce: str) -> dict[int, dict]:
    """The harness's reports in `stdout` by test index (the first one of each)."""
    out: dict[int, dict] = {}
    for rec in _records(stdout, nonce):
        if isinstance(rec.get("t"), int):
            out.setdefault(rec["t"], rec)
    return out


# -- comparison (plain data only) ---------------------------------------------------------


def _judge_call(test: CallTest, frame: dict) -> Outcome:
    exp = canon(test.expected)
    if test.method is not None:  # the builtin method's yes/no, here (no value back: no yes/no)
        got = method_result(test, frame["v"]) if "v" in frame else None
        ok = got is not None and got is bool(test.expected)  # expected: a bool (or truthy)
    elif test.match == "truthy":
        got = _truthy(frame["v"]) if "v" in frame else frame.get("b")
        ok = got is bool(test.expected)
    elif "v" not in frame:  # large value: exact comparison through its hash
        ok = frame.get("h") == _sha(_dumps(exp))
    else:
        ok = _same(frame["v"], exp, test.tolerance, test.rel_tolerance)
    preview = frame.get("p", _dumps(frame["v"])[:80] if "v" in frame else "")  # a lean frame: v
    detail = "" if ok else f"got {preview!r}"
    if not ok and "v" not in frame and test.method is not None:
        detail += f" (too long to come back: its .{test.method}() is not computed)"
    elif not ok and "v" not in frame and (test.tolerance, test.rel_tolerance) != (None, None):
        why = "cut to fit the report" if frame.get("cut") else f"over {_INLINE} characters of JSON"
        detail += f" ({why}: compared exactly, not within tolerance)"
    return Outcome(index=0, passed=ok, status="pass" if ok else "wrong", detail=detail)


def _judge(test: IOTest | CallTest, frame: dict | None) -> Outcome:
    if frame is None or frame.get("missing"):
        status = "timeout" if frame and frame.get("to") else "missing"
        return Outcome(index=0, passed=False, status=status,
                           detail=(frame or {}).get("e", "no result (the run ended early)"))  # fmt: skip
    if "err" in frame:
        status = "timeout" if frame["err"] == "timeout" else "error"
        return Outcome(index=0, passed=False, status=status, detail=frame["err"],
                       tampered=bool(frame.get("forged")))  # fmt: skip
    if isinstance(test, CallTest):
        return _judge_call(test, frame)
    if frame.get("to"):
        return Outcome(index=0, passed=False, status="timeout")
    ok = frame.get("h") == _sha(normalize_output(test.expected))
    detail = (
        "" if ok else f"got {frame.get('p', '')!r} (exit {frame.get('rc')}) {frame.get('e', '')}"
    )
    return Outcome(index=0, passed=ok, status="pass" if ok else "wrong", detail=detail.strip())


# -- grading: one sandbox call per test ---------------------------------------------------


def _note_frames(which: str, frames: list[dict], notes: list[str]) -> None:
    """Notes the harness failing on what the solution left once it ran (an `err` frame: the
    test failed, the solution's outcome; a lost report would have been an outage the policy
    could make at will), so a bug of ours there stays visible; and frames cut to fit their
    share of the report (texts shortened, said in them; values compared through hashes)."""
    errs = {str(f.get("err")) for f in frames} - {"None"}
    if bad := next((e for e in errs if e.startswith("the harness failed")), None):
        notes.append(f"{which}: {bad} (counted as failed; a grader bug if the solution did "
                     "nothing unusual)")  # fmt: skip
    if cut := sum(bool(f.get("cut")) for f in frames):
        notes.append(f"{which}: {cut} of {len(frames)} reports cut to their share of the "
                     "sandbox's output: texts shortened (marked 'more characters cut'), values "
                     "compared through their hashes")  # fmt: skip


def _how_it_ended(res: ExecResult) -> str:
    how = f"exit {res.exit_code}" + (f", limit {res.limit}" if res.limit else "")
    how += ", timed out" if res.timed_out else ""
    how += ", output truncated" if res.truncated else ""
    tail = res.stderr.strip().splitlines()[-1:] if res.stderr.strip() else []
    return how + (f": {tail[0][:160]}" if tail else "")


def _killed(res: ExecResult) -> bool:
    """A signal ended the harness with no limit or timeout behind it: the solution's kill (the
    OOM killer's would show as limit "memory", the CPU watch's as "cpu_time")."""
    return res.exit_code is not None and res.exit_code < 0 and not res.limit and not res.timed_out


def _solution_ended_it(res: ExecResult) -> bool:
    """The harness was stopped, killed or cut by a limit: what a solution can do to it (the
    harness's own work is small, it ignores catchable signals and reports before it exits)."""
    return res.timed_out or res.limit is not None or res.exit_code is None or res.exit_code < 0


async def _grade_one(
    sandbox: Sandbox,
    solution: str,
    i: int,
    test: IOTest | CallTest,
    timeout_s: float,
    entry_point: str | None,
    notes: list[str],
    files: dict[str, str] | None = None,
) -> Outcome:
    if isinstance(test, IOTest):
        kind, spec = "io", {"i": i, "stdin": test.stdin}
    else:
        kind, spec = "call", {"i": i, "call": test.call}
    how = ""
    for attempt in range(2):
        nonce = secrets.token_hex(16)
        code = harness_code(spec, kind, solution, timeout_s, nonce, entry_point, attempt > 0, files)
        res = await sandbox.run(code, language="python", timeout=timeout_s + _SLACK_S)
        records = _records(res.stdout, nonce)
        frame = next((r for r in records if r.get("t") == i), None)
        started = any(r.get("s") == i for r in records)
        if frame is not None and "harness" not in frame:
            if res.limit:
                notes.append(f"test {i}: sandbox limit {res.limit}")
            _note_frames(f"test {i}", [frame], notes)
            return _judge(test, frame).model_copy(update={"index": i})
        how = frame["harness"] if frame is not None else _how_it_ended(res)
        if frame is None and (started or res.limit == "code_size") and _solution_ended_it(res):
            notes.append(f"test {i}: no report ({how}): the solution's doing, counted as failed")
            timed_out = res.timed_out or res.limit in ("wall_time", "cpu_time")
            status = "timeout" if timed_out else "error" if res.limit else "missing"
            return Outcome(index=i, passed=False, status=status, detail=f"no report ({how})",
                           tampered=_killed(res))  # fmt: skip
        if attempt == 0:
            notes.append(
                f"test {i}: the report was lost, not by the solution ({how}); run again with a "
                "compact report"
            )
    raise SandboxUnavailable(
        f"grade(): the harness's report of test {i} was lost twice, not by the solution "
        f"({how}); check the sandbox (its /health, limits.output_bytes) or report a grader bug"
    )


async def _grade_batch(
    sandbox: Sandbox,
    solution: str,
    first: int,
    tests: Sequence[CallTest],
    timeout_s: float,
    entry_point: str | None,
    notes: list[str],
    files: dict[str, str] | None,
) -> list[Outcome]:
    """CallTests `first`.. in one sandbox call and one interpreter, in order, each with
    `timeout_s` of the call's time (`timeout_s * len(tests)` in all): what one test leaves
    behind (state, a hang) can cost the ones after it, never make them pass."""
    idx = list(range(first, first + len(tests)))
    spec = {"i": idx, "calls": [t.call for t in tests]}
    total = timeout_s * len(tests)
    how = ""
    for attempt in range(2):
        nonce = secrets.token_hex(16)
        inline = max(256, _INLINE // len(tests))  # the frames together fit the sandbox's output
        code = harness_code(
            spec, "call", solution, total, nonce, entry_point, attempt > 0, files, inline
        )
        res = await sandbox.run(code, language="python", timeout=total + _SLACK_S)
        frames = _frames(res.stdout, nonce)
        started = any(r.get("s") == idx for r in _records(res.stdout, nonce))
        if all(i in frames and "harness" not in frames[i] for i in idx):
            if res.limit:
                notes.append(f"tests {idx[0]}-{idx[-1]}: sandbox limit {res.limit}")
            _note_frames(f"tests {idx[0]}-{idx[-1]}", list(frames.values()), notes)
            return [_judge(t, frames[i]).model_copy(update={"index": i})
                    for i, t in zip(idx, tests, strict=True)]  # fmt: skip
        how = next((frames[i]["harness"] for i in idx if "harness" in frames.get(i, {})), "")
        how = how or _how_it_ended(res)
        # too large to run (the solution with its files, as in _grade_one): its doing. Counted
        # as lost, a package padded past max_code_bytes made its episode an outage at will
        too_big = res.limit == "code_size"
        if (started or too_big) and _solution_ended_it(res):
            notes.append(f"tests {idx[0]}-{idx[-1]}: reports missing ({how}): the solution's doing")
            if too_big:
                return [Outcome(index=i, passed=False, status="error", detail=f"no report ({how})")
                        for i in idx]  # fmt: skip
            killed = {"tampered": True} if _killed(res) else {}
            return [_judge(t, frames.get(i)).model_copy(update={"index": i}
                                                        | ({} if i in frames else killed))
                    for i, t in zip(idx, tests, strict=True)]  # fmt: skip
        if attempt == 0:
            notes.append(f"tests {idx[0]}-{idx[-1]}: reports lost, not by the solution ({how})")
    raise SandboxUnavailable(
        f"grade(): the harness's reports of tests {idx[0]}-{idx[-1]} were lost twice, not by "
        f"the solution ({how}); check the sandbox (its /health, limits.output_bytes)"
    )


async def _grade_batched(
    sandbox: Sandbox,
    solution: str,
    tests: Sequence[IOTest | CallTest],
    timeout_s: float,
    entry_point: str | None,
    max_call_s: float,
    gate: asyncio.Semaphore,
    files: dict[str, str] | None,
) -> GradeResult:
    """grade(batch=True): the tests in chunks that each fit one call of `max_call_s` and whose
    reports fit the sandbox's output (at most _MAX_BATCH tests)."""
    if not all(isinstance(t, CallTest) for t in tests):
        raise ValueError("grade(batch=True) takes CallTest items")
    size = min(_MAX_BATCH, max(1, int((max_call_s - _SLACK_S) // timeout_s)))
    chunks = [list(range(i, min(i + size, len(tests)))) for i in range(0, len(tests), size)]
    notes: list[str] = []

    async def run_chunk(ix: list[int]) -> list[Outcome]:
        async with gate:
            part = [tests[i] for i in ix]
            return await _grade_batch(sandbox, solution, ix[0], part, timeout_s,  # type: ignore[arg-type]
                                      entry_point, notes, files)  # fmt: skip

    outcomes = [o for part in await gather_all(map(run_chunk, chunks)) for o in part]
    return GradeResult(passed=sum(o.passed for o in outcomes), total=len(outcomes),
                       outcomes=outcomes, notes=notes)  # fmt: skip


async def grade(
    sandbox: Sandbox,
    solution: str,
    tests: Sequence[IOTest | CallTest],
    *,
    timeout_s: float = 5.0,
    entry_point: str | None = None,
    max_call_s: float = 120.0,
    parallel: int = 1,
    files: dict[str, str] | None = None,
    batch: bool = False,
) -> GradeResult:
    """Run `solution` against `tests` in `sandbox` (one one-shot call per test) and score it here.
    Raises SandboxUnavailable if the sandbox is down (an infrastructure failure, not a 0).

    Each call's wall limit is `timeout_s` + 3 s and must fit `max_call_s` (the sandbox's longest
    call: the service's `limits.max_wall_s`), else ValueError. `parallel` tests run at once (1:
    one after another; more is faster, but the tests then share the CPUs their wall time counts).
    `files`: a repository the solution imports from (relative path -> text; the SWE env's graded
    tree without its tests), written fresh for every call and first on the import path. The
    solution can read them: never put a test file or an expected value there. `batch` (CallTests
    only): the tests run in as few calls as fit `max_call_s` (at most `_MAX_BATCH` = 250 tests a
    call, whose reports fit the sandbox's output), in one interpreter each, as a test
    suite runs (`_grade_batch`); a test there shares its process with the ones before it, so use
    it where the tests check one program's behaviour, not for separate attempts."""
    for rel in files or {}:
        parts = Path(rel).parts
        if not parts or Path(rel).is_absolute() or ".." in parts:
            raise ValueError(
                f"grade(): files must be relative paths inside the repository: {rel!r}"
            )
    if timeout_s + _SLACK_S > max_call_s:
        raise ValueError(
            f"grade(): timeout_s={timeout_s:g} per test does not fit a sandbox call of "
            f"max_call_s={max_call_s:g} (needs >= {timeout_s + _SLACK_S:g}); lower timeout_s or "
            "raise the sandbox's max_wall_s"
        )
    if len({type(t) for t in tests}) > 1:
        raise ValueError("grade() takes either IOTest or CallTest items, not both")
    gate = asyncio.Semaphore(max(1, parallel))
    notes: list[list[str]] = [[] for _ in tests]
    with grading():  # the grader's lane: the policy's own calls never make these wait
        if batch and tests:
            return await _grade_batched(sandbox, solution, tests, timeout_s, entry_point,
                                        max_call_s, gate, files)  # fmt: skip

        async def one(i: int) -> Outcome:
            async with gate:
                return await _grade_one(
                    sandbox, solution, i, tests[i], timeout_s, entry_point, notes[i], files
                )

        # one raised (SandboxUnavailable) or we were cancelled: the others stop
        outcomes = await gather_all(one(i) for i in range(len(tests)))
    passed = sum(o.passed for o in outcomes)
    flat = [n for per_test in notes for n in per_test]
    return GradeResult(passed=passed, total=len(outcomes), outcomes=outcomes, notes=flat)
