"""Generate the shipped SWE task set: bugs injected into small Python repositories, deterministic.

    python -m agentrl.assets.swe.generate [OUT_DIR]     # default: agentrl/assets/swe

For each repository in `repos/` (a package and its tests, every test one `assert CALL == VALUE`),
each operator or number token inside a function is a candidate bug (SWE-smith style, token
mutations: `<` ↔ `<=`, `+` ↔ `-`, `==` ↔ `!=`, `and` ↔ `or`, `//` → `/`, an integer n → n + 1, …).
A mutation is a task when it makes at least one test fail (FAIL_TO_PASS: those tests) while the
module still imports; the other tests are PASS_TO_PASS. At most `PER_FUNCTION` tasks per function,
taken in source order with distinct failing tests.

What is written, in SWE-bench's instance format:
- `bundles/<repo>.bundle`: a git bundle per repository: the pristine commit, and per task a commit
  on top of it with the bug in and the FAIL_TO_PASS tests taken out of the test file (the
  agent's repository), tagged with the instance id. Authors and dates are fixed, so the same
  sources give the same commit ids.
- `tasks.jsonl`: one instance per line: instance_id, repo, base_commit, patch (the fix),
  test_patch (puts the hidden tests back), FAIL_TO_PASS, PASS_TO_PASS (pytest node ids),
  problem_statement (what a failing test's call returns against what it should), version.

Whether a test fails is decided here by evaluating its call in-process on the mutated module (with
a 0.25 s alarm for loops the mutation made endless): the repositories are ours and trusted.
"""

from __future__ import annotations

import ast
import io
import json
import logging
import os
import signal
import subprocess
import sys
import tempfile
import tokenize
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)
HERE = Path(__file__).parent
REPOS = HERE / "repos"
PER_FUNCTION = 3
HANG_S = 0.25  # a test call still running after this never returns (the repos' calls take µs)
# token → its mutation: comparison, arithmetic and boolean operators, augmented assignments
SWAPS = {
    "<": "<=", "<=": "<", ">": ">=", ">=": ">", "==": "!=", "!=": "==",
    "+": "-", "-": "+", "//": "/", "%": "//", "+=": "-=", "-=": "+=",
    "and": "or", "or": "and", "True": "False", "False": "True",
}  # fmt: skip
GIT_ENV = {
    "GIT_AUTHOR_NAME": "agentrl", "GIT_AUTHOR_EMAIL": "agentrl@localhost",
    "GIT_COMMITTER_NAME": "agentrl", "GIT_COMMITTER_EMAIL": "agentrl@localhost",
    "GIT_AUTHOR_DATE": "2026-01-01T00:00:00+0000", "GIT_COMMITTER_DATE": "2026-01-01T00:00:00+0000",
    "GIT_CONFIG_GLOBAL": "/dev/null", "GIT_CONFIG_NOSYSTEM": "1",
}  # fmt: skip


@dataclass
class Repo:
    name: str
    module_path: str  # e.g. "textkit/text.py"
    test_path: str  # e.g. "tests/test_text.py"
    files: dict[str, str]  # every file of the pristine repository

    @property
    def module(self) -> str:
        return self.files[self.module_path]

    @property
    def tests(self) -> str:
        return self.files[self.test_path]


def load_repo(path: Path) -> Repo:
    files = {str(p.relative_to(path)): p.read_text() for p in sorted(path.rglob("*.py"))}
    (test_path,) = [f for f in files if f.startswith("tests/test_")]
    (module_path,) = [f for f in files if "/" in f and not f.startswith("tests/")
                      and not f.endswith("__init__.py")]  # fmt: skip
    return Repo(path.name, module_path, test_path, files)


# -- tests as calls ------------------------------------------------------------------------------


@dataclass
class Check:
    """One test function: `assert call == expected` (or `is`)."""

    name: str
    call: str
    expected: object
    lines: tuple[int, int]  # first and last line of the function, 1-based, decorators none


def checks(test_source: str) -> list[Check]:
    out = []
    for node in ast.parse(test_source).body:
        if not isinstance(node, ast.FunctionDef) or not node.name.startswith("test"):
            continue
        (stmt,) = node.body
        if not (isinstance(stmt, ast.Assert) and isinstance(stmt.test, ast.Compare)
                and isinstance(stmt.test.ops[0], ast.Eq | ast.Is)):  # fmt: skip
            raise ValueError(f"{node.name}: a test must be one `assert CALL == VALUE`")
        expected = ast.literal_eval(stmt.test.comparators[0])
        out.append(Check(node.name, ast.unparse(stmt.test.left), expected,
                         (node.lineno, node.end_lineno or node.lineno)))  # fmt: skip
    return out


class _Alarm(Exception):
    pass


def _on_alarm(signum, frame):
    raise _Alarm()


def run_checks(module_source: str, tests: list[Check]) -> dict[str, tuple[bool, str]]:
    """name → (passed, what the call gave: a repr, or the exception) on `module_source`."""
    ns: dict = {"__name__": "mutated"}
    exec(compile(module_source, "mutated.py", "exec"), ns)
    old = signal.signal(signal.SIGALRM, _on_alarm)
    out = {}
    try:
        for t in tests:
            signal.setitimer(signal.ITIMER_REAL, HANG_S)
            try:
                value = eval(t.call, ns)
                same = type(value) is type(t.expected) and value == t.expected
                out[t.name] = (same, repr(value))
            except _Alarm:
                out[t.name] = (False, "never returns")
            except Exception as e:
                out[t.name] = (False, f"raises {type(e).__name__}: {e}")
            finally:
                signal.setitimer(signal.ITIMER_REAL, 0)
    finally:
        signal.signal(signal.SIGALRM, old)
    return out


# -- mutations -----------------------------------------------------------------------------------


@dataclass
class Mutation:
    function: str
    line: int
    col: int
    old: str
    new: str

    def apply(self, source: str) -> str:
        lines = source.splitlines(keepends=True)
        text = lines[self.line - 1]
        assert text[self.col : self.col + len(self.old)] == self.old
        lines[self.line - 1] = text[: self.col] + self.new + text[self.col + len(self.old) :]
        return "".join(lines)


def mutations(source: str) -> list[Mutation]:
    """Every candidate bug inside a function body (not its docstring or signature), in order."""
    bodies = []
    for node in ast.parse(source).body:
        if isinstance(node, ast.FunctionDef):
            first = node.body[0]
            start = first.end_lineno + 1 if isinstance(first, ast.Expr) else first.lineno
            bodies.append((node.name, start or node.lineno, node.end_lineno or node.lineno))
    out = []
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        row, col = tok.start
        owner = next((name for name, lo, hi in bodies if lo <= row <= hi), None)
        if owner is None:
            continue
        if tok.string in SWAPS and tok.type in (tokenize.OP, tokenize.NAME):
            out.append(Mutation(owner, row, col, tok.string, SWAPS[tok.string]))
        elif tok.type == tokenize.NUMBER and tok.string.isdigit():
            out.append(Mutation(owner, row, col, tok.string, str(int(tok.string) + 1)))
    return out


# -- tasks ---------------------------------------------------------------------------------------


def without_functions(source: str, spans: list[tuple[int, int]]) -> str:
    """`source` with the given line spans (and the blank lines before each) taken out."""
    lines = source.splitlines(keepends=True)
    drop: set[int] = set()
    for lo, hi in spans:
        drop.update(range(lo - 1, hi))
        k = lo - 2
        while k >= 0 and not lines[k].strip():
            drop.add(k)
            k -= 1
    return "".join(line for i, line in enumerate(lines) if i not in drop)


def statement(repo: Repo, check: Check, got: str) -> str:
    said = got if got.startswith(("raises", "never")) else f"returns {got}"
    return (f"In {repo.name}, `{check.call}` {said}, but it should return "
            f"{check.expected!r}.\n\nFind and fix the bug in {repo.module_path}, so that every "
            "function does what its docstring says. The repository's tests run with "
            "`python -m pytest -q tests`.")  # fmt: skip


def repo_tasks(repo: Repo) -> list[dict]:
    tests = checks(repo.tests)
    base = run_checks(repo.module, tests)
    assert all(ok for ok, _ in base.values()), f"{repo.name}: its own tests fail: {base}"
    taken: dict[str, list[frozenset[str]]] = {}
    out = []
    for m in mutations(repo.module):
        seen = taken.setdefault(m.function, [])
        if len(seen) >= PER_FUNCTION:
            continue
        source = m.apply(repo.module)
        try:
            result = run_checks(source, tests)
        except Exception as e:  # the module no longer imports: not a bug a test names
            log.info("%s: %r -> %r on line %d breaks the import (%s): no task", repo.name,
                     m.old, m.new, m.line, type(e).__name__)  # fmt: skip
            continue
        failing = frozenset(n for n, (ok, _) in result.items() if not ok)
        if not failing or failing in seen:
            continue
        seen.append(failing)
        hidden = [t for t in tests if t.name in failing]
        first = hidden[0]
        out.append({"mutation": m, "buggy": source, "failing": failing, "hidden": hidden,
                    "statement": statement(repo, first, result[first.name][1])})  # fmt: skip
    return out


def _git(cwd: Path, *args: str, data: bytes | None = None) -> str:
    env = {**os.environ, **GIT_ENV}
    res = subprocess.run(["git", *args], cwd=cwd, env=env, input=data, capture_output=True,
                         check=True)  # fmt: skip
    return res.stdout.decode()


def _write(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)


def build(out_dir: Path, only: list[str] | None = None) -> list[dict]:
    """Write bundles/ and tasks.jsonl under out_dir (the repositories named in `only`, else all);
    return the instances."""
    instances = []
    (out_dir / "bundles").mkdir(parents=True, exist_ok=True)
    for path in sorted(p for p in REPOS.iterdir() if p.is_dir() and (not only or p.name in only)):
        repo = load_repo(path)
        with tempfile.TemporaryDirectory() as tmp:
            work = Path(tmp)
            _git(work, "init", "-q", "-b", "main")
            _write(work, repo.files)
            _git(work, "add", "-A")
            _git(work, "commit", "-q", "-m", f"{repo.name}: pristine")
            pristine = _git(work, "rev-parse", "HEAD").strip()
            for k, t in enumerate(repo_tasks(repo)):
                iid = f"agentrl__{repo.name}-{k + 1:03d}"
                visible = without_functions(repo.tests, [c.lines for c in t["hidden"]])
                _git(work, "checkout", "-q", pristine)
                _write(work, {repo.module_path: t["buggy"], repo.test_path: visible})
                _git(work, "commit", "-q", "-am", f"{iid}: {t['mutation'].function}")
                base = _git(work, "rev-parse", "HEAD").strip()
                _git(work, "tag", iid)
                _write(work, {repo.module_path: repo.module})
                patch = _git(work, "diff", "--", repo.module_path)
                _git(work, "checkout", "-q", "--", repo.module_path)
                _write(work, {repo.test_path: repo.tests})
                test_patch = _git(work, "diff", "--", repo.test_path)
                _git(work, "checkout", "-q", "--", repo.test_path)
                f2p = sorted(f"{repo.test_path}::{n}" for n in t["failing"])
                p2p = [f"{repo.test_path}::{c.name}" for c in checks(repo.tests)
                       if c.name not in t["failing"]]  # fmt: skip
                instances.append({
                    "instance_id": iid, "repo": repo.name, "base_commit": base, "patch": patch,
                    "test_patch": test_patch, "FAIL_TO_PASS": f2p, "PASS_TO_PASS": p2p,
                    "problem_statement": t["statement"], "version": "1",
                    "environment_setup_commit": pristine,
                })  # fmt: skip
            _git(work, "checkout", "-q", pristine)
            bundle = out_dir / "bundles" / f"{repo.name}.bundle"
            _git(work, "bundle", "create", "-q", str(bundle.resolve()), "--all")
    with (out_dir / "tasks.jsonl").open("w") as f:
        for inst in instances:
            f.write(json.dumps(inst, sort_keys=True) + "\n")
    return instances


def main() -> None:
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else HERE
    instances = build(out)
    per_repo: dict[str, int] = {}
    for inst in instances:
        per_repo[inst["repo"]] = per_repo.get(inst["repo"], 0) + 1
    print(f"{len(instances)} tasks ({per_repo}) in {out}")


if __name__ == "__main__":
    main()
