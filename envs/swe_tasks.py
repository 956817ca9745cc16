"""SWE tasks on the host: instances in SWE-bench's format, repository snapshots, the graded tree.

    from agentrl.envs.swe_tasks import load_instances, Snapshots, graded_tree, hidden_tests

An instance is one JSON object per line (SWE-bench's fields: instance_id, repo, base_commit,
patch, test_patch, FAIL_TO_PASS, PASS_TO_PASS, problem_statement). Its repository is found
locally, never fetched: `<repos>/<repo>.bundle` (a git bundle), or `<repos>/<repo>` (a git
checkout), with `/` in the repo's name written as `__` (`django/django` -> `django__django`).
The shipped set (agentrl/assets/swe: 64 bugs injected into five small packages by
`python -m agentrl.assets.swe.generate`) is the default.

What is graded (`graded_tree`): the snapshot at base_commit, with the agent's changes to source
files only (`.py` files inside the snapshot's packages, not tests, not the files of the hidden
checks whatever their names, not conftest.py, not site/user customize hooks: whatever else it
wrote is ignored), then the test_patch applied with
`git apply`. The hidden tests (FAIL_TO_PASS + PASS_TO_PASS) must each be one
`assert CALL == VALUE`-style check (`sandbox.grader.asserts_to_tests`): the value never enters
the sandbox, so printing "passed", exiting 0 or patching pytest earns nothing.
"""

from __future__ import annotations

import ast
import contextlib
import hashlib
import io
import json
import os
import subprocess
import tarfile
import tempfile
from pathlib import Path, PurePosixPath
from typing import Any

from agentrl.sandbox.grader import CallTest, asserts_to_tests
from agentrl.task_file import jsonl_objects

SHIPPED = Path(__file__).resolve().parent.parent / "agentrl" / "assets" / "swe"
# files an agent's change may never reach the graded tree through: test code and what loads
# before or around it (pytest and interpreter hooks, packaging and test configuration)
NEVER = {"conftest.py", "sitecustomize.py", "usercustomize.py", "__main__.py"}


def load_instances(path: str | Path | None = None) -> list[dict[str, Any]]:
    """The instances of a JSONL file (agentrl/task_file.py reads it: a bad line is an error
    naming its number), each checked by `check_instance`."""
    path = Path(path) if path else SHIPPED / "tasks.jsonl"
    return [check_instance(row, f"{path} line {i + 1}") for i, row in jsonl_objects(path)]


_NEED = ("instance_id", "repo", "base_commit", "test_patch", "FAIL_TO_PASS", "PASS_TO_PASS",
         "problem_statement")  # fmt: skip
_TEXT = ("instance_id", "repo", "base_commit", "problem_statement")  # and not empty


def check_instance(row: dict[str, Any], where: str) -> dict[str, Any]:
    """`row` with its test ids as lists, when every field is what the env reads; else a
    ValueError at `where`. Each wrong field failed later, in every episode of the task: a
    problem statement that is not text or an image that is no name in start() (`aborted`, left
    out of the baseline as infrastructure), a test patch that is not text in reward()
    (`reward_error`); an empty FAIL_TO_PASS scored every episode 0 whatever it did, and a
    base_commit starting with '-' went to `git archive` as an option."""
    if missing := [k for k in _NEED if k not in row]:
        raise ValueError(f"{where}: instance {row.get('instance_id')!r} lacks {missing}")
    name = f"{where}: instance {row['instance_id']!r:.80}"
    for key in _TEXT:
        if not (isinstance(row[key], str) and row[key].strip()):
            raise ValueError(f"{name}: {key} is {row[key]!r:.60}; give it as non-empty text")
    if not isinstance(row["test_patch"], str):
        raise ValueError(f"{name}: test_patch is {row['test_patch']!r:.60}; give the diff as text")
    if row["base_commit"].startswith("-") or row["repo"] in (".", ".."):
        raise ValueError(f"{name}: base_commit {row['base_commit']!r:.60} / repo {row['repo']!r}: "
                         "a commit's hash and a repository's name (owner/name)")  # fmt: skip
    if row.get("image") is not None and not (isinstance(row["image"], str) and row["image"]):
        raise ValueError(f"{name}: image is {row['image']!r:.60}; the name of one of the sandbox "
                         "service's images, or null")  # fmt: skip
    for key in ("FAIL_TO_PASS", "PASS_TO_PASS"):
        row[key] = _test_ids(row[key], f"{name}: {key}", need_one=key == "FAIL_TO_PASS")
    return row


def _test_ids(value: Any, where: str, need_one: bool) -> list[str]:
    """SWE-bench's test ids: a list of `path::test` strings, or that list as a JSON string."""
    if isinstance(value, str):  # SWE-bench writes these as JSON strings
        try:
            value = json.loads(value)
        except ValueError:
            raise ValueError(f"{where} is the text {value[:60]!r}, not a JSON list") from None
    if not (isinstance(value, list) and all(isinstance(t, str) and "::" in t for t in value)):
        raise ValueError(f"{where} is {value!r:.80}; give a list of test ids, 'path::test'")
    if need_one and not value:
        raise ValueError(
            f"{where} is empty: an instance is resolved when its failing tests pass, so with "
            "none every episode scores 0; name one at least"
        )
    return value


def _git(*args: str, cwd: Path | None = None, data: bytes | None = None) -> bytes:
    try:
        res = subprocess.run(["git", *args], cwd=cwd, input=data, capture_output=True)
    except FileNotFoundError as e:
        raise RuntimeError("the SWE env reads repositories with git: install git") from e
    if res.returncode:
        raise RuntimeError(f"git {' '.join(args[:3])} failed: {res.stderr.decode()[-400:]}")
    return res.stdout


class Snapshots:
    """Repository files at a commit, read from local bundles or checkouts (cached)."""

    def __init__(self, repos: str | Path | None = None) -> None:
        self.repos = Path(repos) if repos else SHIPPED / "bundles"
        self._git_dirs: dict[str, Path] = {}
        self._files: dict[tuple[str, str], dict[str, str]] = {}

    def locate(self, repo: str) -> tuple[Path, Path]:
        """(its bundle, its checkout): one of them is there, else a FileNotFoundError."""
        name = repo.replace("/", "__")
        bundle, checkout = self.repos / f"{name}.bundle", self.repos / name
        if not (bundle.is_file() or (checkout / ".git").exists() or (checkout / "HEAD").exists()):
            raise FileNotFoundError(
                f"repository {repo!r}: neither {bundle} nor a git checkout at {checkout}; put "
                "one there, or set env.tasks.repos to the folder that holds them"
            )
        return bundle, checkout

    def git_dir(self, repo: str) -> Path:
        if repo not in self._git_dirs:
            bundle, checkout = self.locate(repo)
            name = checkout.name
            if bundle.is_file():
                digest = hashlib.sha256(bundle.read_bytes()).hexdigest()[:16]
                cache = Path(os.environ.get("AGENTRL_CACHE", Path.home() / ".cache" / "agentrl"))
                dest = cache / "swe" / f"{name}-{digest}"
                if not (dest / "HEAD").exists():  # cloned once per bundle content
                    dest.parent.mkdir(parents=True, exist_ok=True)
                    with tempfile.TemporaryDirectory(dir=dest.parent) as tmp:
                        _git("clone", "-q", "--mirror", str(bundle), f"{tmp}/r")
                        with contextlib.suppress(OSError):  # another process was first
                            os.rename(f"{tmp}/r", dest)
                self._git_dirs[repo] = dest
            else:
                self._git_dirs[repo] = checkout
        return self._git_dirs[repo]

    def files(self, repo: str, commit: str) -> dict[str, str]:
        """Every text file of `repo` at `commit` (binary files are left out)."""
        key = (repo, commit)
        if key not in self._files:
            raw = _git("archive", "--format=tar", commit, cwd=self.git_dir(repo))
            out = {}
            with tarfile.open(fileobj=io.BytesIO(raw)) as tar:
                for m in tar.getmembers():
                    if m.isfile():
                        data = tar.extractfile(m).read()  # type: ignore[union-attr]
                        try:
                            out[m.name] = data.decode("utf-8")
                        except UnicodeDecodeError:
                            continue
            self._files[key] = out
        return dict(self._files[key])


def source_dirs(files: dict[str, str]) -> set[str]:
    """The snapshot's package directories (holding an __init__.py), tests excluded."""
    return {str(PurePosixPath(p).parent) for p in files
            if p.endswith("/__init__.py") and not _is_test(p)}  # fmt: skip


def _is_test(path: str) -> bool:
    parts = PurePosixPath(path).parts
    name = parts[-1]
    return (any(p in ("tests", "test", "testing") for p in parts[:-1])
            or name.startswith("test_") or name.endswith("_test.py"))  # fmt: skip


def gradable(path: str, packages: set[str]) -> bool:
    """May an agent's version of `path` enter the graded tree?"""
    p = PurePosixPath(path)
    # one spelling per file: "pkg//tests.py" or "pkg/./tests.py" is the instance's pkg/tests.py
    # on disk, but not by name (a read-back the agent forged; its session's interpreter is its)
    if p.is_absolute() or ".." in p.parts or not path.endswith(".py") or str(p) != path:
        return False
    if p.name in NEVER or _is_test(path) or p.name.endswith(".pth"):
        return False
    return str(p.parent) in packages


def instance_files(test_patch: str, test_ids: list[str] | tuple[str, ...] = ()) -> set[str]:
    """The files that hold the hidden checks, whatever their names: those the test patch
    touches and those the FAIL_TO_PASS / PASS_TO_PASS ids name (`path::test`)."""
    return set(_patched_paths(test_patch)) | {t.partition("::")[0] for t in test_ids}


def graded_tree(
    snapshot: dict[str, str],
    agent: dict[str, str] | None,
    test_patch: str,
    test_ids: list[str] | tuple[str, ...] = (),
) -> dict[str, str]:
    """The snapshot with the agent's gradable changes (`agent`: its whole tree of .py files,
    None when it could not be read: no changes), then the test patch. A file of the hidden
    checks (`instance_files`) is the instance's, never the agent's, whatever its name: a
    red-team agent appended its own `def test_x(): assert f(2) == 2` to `pkg/tests.py` (not a
    test by name), the patch applied above it, and the later def replaced the hidden check."""
    tree = dict(snapshot)
    if agent is not None:
        packages, patched = source_dirs(snapshot), instance_files(test_patch, test_ids)

        def mine(p: str) -> bool:
            return gradable(p, packages) and p not in patched

        for path in [p for p in tree if mine(p) and p not in agent]:
            del tree[path]  # deleted by the agent
        tree.update({p: text for p, text in agent.items() if mine(p)})
    if test_patch.strip():  # on the files it touches only, never the agent's (a name the host's
        with tempfile.TemporaryDirectory() as tmp:  # filesystem folds or refuses is not written)
            root = Path(tmp)
            for rel in [p for p in _patched_paths(test_patch) if p in tree]:
                (root / rel).parent.mkdir(parents=True, exist_ok=True)
                (root / rel).write_text(tree[rel])
            _git("apply", "--whitespace=nowarn", "-", cwd=root, data=test_patch.encode())
            for path in _patched_paths(test_patch):
                f = root / path
                if f.is_file():
                    tree[path] = f.read_text()
                else:
                    tree.pop(path, None)
    return tree


def grading_files(
    tree: dict[str, str], test_patch: str, test_ids: list[str] | tuple[str, ...] = ()
) -> dict[str, str]:
    """What of the graded tree enters the grading sandbox: the sources the checks import, and no
    test file (the hidden checks' `instance_files`, or any by its name or folder). The hidden
    tests' expected values must stay with the trainer (`grade` compares there): code the agent
    wrote runs in that sandbox, and could read them from a test file and answer each check."""
    patched = instance_files(test_patch, test_ids)
    return {path: text for path, text in tree.items()
            if not _is_test(path) and path not in patched
            and PurePosixPath(path).name not in NEVER}  # fmt: skip


def _patched_paths(patch: str) -> list[str]:
    out = []
    for line in patch.splitlines():
        if line.startswith("+++ b/") or line.startswith("--- a/"):
            out.append(line[6:].strip())
    return sorted(set(out))


def _reads_tests(stmt: ast.Import | ast.ImportFrom, tree: dict[str, str]) -> bool:
    """Whether an import in a test file needs a test module (relative: its own package)."""
    if isinstance(stmt, ast.ImportFrom) and stmt.level:
        return True
    bases = [stmt.module] if isinstance(stmt, ast.ImportFrom) else [a.name for a in stmt.names]
    subs = (
        [f"{stmt.module}.{a.name}" for a in stmt.names] if isinstance(stmt, ast.ImportFrom) else []
    )
    for name in [b for b in bases if b] + subs:
        stem = name.replace(".", "/")
        if any(c in tree and _is_test(c) for c in (f"{stem}.py", f"{stem}/__init__.py")):
            return True
    return False


def hidden_tests(tree: dict[str, str], ids: list[str]) -> dict[str, tuple[str, list[CallTest]]]:
    """Test file -> (its imports: the code the calls run after, the CallTests of `ids` in it,
    in order). A test that is not one gradable check raises ValueError naming it."""
    by_file: dict[str, list[str]] = {}
    for tid in ids:
        path, _, name = tid.partition("::")
        by_file.setdefault(path, []).append(name)
    out = {}
    for path, names in by_file.items():
        module = ast.parse(tree[path])
        stmts = [n for n in module.body if isinstance(n, ast.Import | ast.ImportFrom)]
        for stmt in stmts:
            if _reads_tests(stmt, tree):
                raise ValueError(
                    f"{path}: {ast.unparse(stmt)!r} imports from the tests; the grading sandbox "
                    "gets no test file (they hold the expected values): move what the tests need "
                    "into the package"
                )
        imports = "\n".join(ast.unparse(n) for n in stmts)
        funcs = {n.name: n for n in module.body if isinstance(n, ast.FunctionDef)}
        own = _module_names(module)
        tests = []
        for name in names:
            if name not in funcs:
                raise ValueError(f"{path}::{name}: no such test function")
            (test,) = asserts_to_tests(ast.unparse(funcs[name]))  # one check per test
            call = ast.parse(test.call, mode="eval")
            if read := sorted({n.id for n in ast.walk(call) if isinstance(n, ast.Name)} & own):
                raise ValueError(
                    f"{path}::{name}: `{test.call[:60]}` reads {', '.join(read)}, which the test "
                    "file defines; the grading sandbox gets no test file (there the name is the "
                    "package's to define, through a star import): inline it or move it into the "
                    "package"
                )
            tests.append(test)
        out[path] = (imports, tests)
    return out


def _module_names(module: ast.Module) -> set[str]:
    """The names a test module binds itself (helpers, constants), not through its imports."""
    out: set[str] = set()
    for stmt in module.body:
        if isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            out.add(stmt.name)
        elif not isinstance(stmt, ast.Import | ast.ImportFrom):
            out.update(n.id for n in ast.walk(stmt)
                       if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store))  # fmt: skip
    return out
