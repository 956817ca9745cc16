"""The SWE env's grading against what a policy (or a large repository) can do to it, on the real
sandbox service: an honest fix in a package larger than the session's output is still graded,
and a package padded past what one grading call holds is the policy's zero, never an outage."""

from __future__ import annotations

import base64
import io
import json
import random
import subprocess
import tarfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from agentrl.env import AssistantTurn
from agentrl.envs.swe import SweEnv
from agentrl.sandbox import Limits, ServerConfig, ServiceSandbox
from agentrl.sandbox.server import LocalService
from agentrl.tool import ToolContext
from agentrl.types import Message, Task, ToolCall

CORE = "def double(x):\n    return x + 2\n"
TESTS = "from bigpkg.core import double\n\n\ndef test_one():\n    assert double(2) == 4\n"
TEST_PATCH = """--- a/tests/test_core.py
+++ b/tests/test_core.py
@@ -5,1 +5,5 @@
     assert double(2) == 4
+
+
+def test_three():
+    assert double(3) == 6
"""
FIX = "cd /tmp/repo && sed -i 's/x + 2/x * 2/' bigpkg/core.py"


@pytest.fixture(scope="module")
def service() -> Iterator[LocalService]:
    cfg = ServerConfig(warm_workers=2, max_running=4, limits=Limits(wall_s=30, memory_mb=512))
    with LocalService(cfg) as svc:
        yield svc


@pytest.fixture
async def sandbox(service: LocalService):
    sb = ServiceSandbox(service.url)
    yield sb
    await sb.aclose()


def big_instance(tmp_path: Path, modules: int) -> Task:
    """A repository whose package holds `core.py` (the bug) and `modules` generated modules of
    27 KB each (random names: they compress about 2:1), as a user's instance."""
    repo = tmp_path / "repos" / "me__big"
    (repo / "bigpkg").mkdir(parents=True)
    (repo / "tests").mkdir()
    (repo / "bigpkg" / "__init__.py").write_text("")
    (repo / "bigpkg" / "core.py").write_text(CORE)
    (repo / "tests" / "test_core.py").write_text(TESTS)
    rnd = random.Random(0)
    for i in range(modules):
        lines = (f"V{rnd.getrandbits(64):x} = {rnd.getrandbits(32)}\n" for _ in range(1000))
        (repo / "bigpkg" / f"gen{i}.py").write_text("".join(lines))

    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True,
                              text=True).stdout  # fmt: skip

    git("init", "-q")
    git("add", "-A")
    git("-c", "user.name=a", "-c", "user.email=a@localhost", "commit", "-qm", "base")
    row = {"instance_id": f"big-{modules}", "repo": "me/big", "base_commit": git("rev-parse",
           "HEAD").strip(), "patch": "", "test_patch": TEST_PATCH,
           "FAIL_TO_PASS": ["tests/test_core.py::test_three"],
           "PASS_TO_PASS": ["tests/test_core.py::test_one"], "problem_statement": "double(3)"}  # fmt: skip
    (tmp_path / "tasks.jsonl").write_text(json.dumps(row) + "\n")
    (task,) = SweEnv.load_tasks(str(tmp_path / "tasks.jsonl"), str(tmp_path / "repos"))
    return task


async def run_episode(sandbox: ServiceSandbox, task: Task, commands: list[str], key: str):
    """Start `task`, run `commands` through the bash tool, and return the env (not closed)."""
    env = SweEnv(task, ToolContext(session=f"{task.id}-{key}", sandbox=sandbox, timeout_s=20))
    await env.start()
    calls = [ToolCall(id=str(i), name="bash", arguments={"command": c})
             for i, c in enumerate(commands)]  # fmt: skip
    res = await env.step(AssistantTurn(Message(role="assistant", content="", tool_calls=calls), ""))
    assert all(o.status == "ok" for o in res.tool_outcomes), res
    return env


async def test_an_honest_fix_in_a_large_package_is_graded(sandbox, tmp_path) -> None:
    """Found by a red-team pass: every source file of the package came back through the
    session's output (64 KB kept), so with 220 KB of package source a correct fix came back
    cut and scored 0 as 'unreadable', in every episode. Only the changed files come back now."""
    task = big_instance(tmp_path, modules=8)
    changes = [FIX, "cd /tmp/repo && rm bigpkg/gen0.py && echo 'Y = 1' > bigpkg/extra.py"]
    env = await run_episode(sandbox, task, changes, "fix")
    try:
        tree, forged = await env._agent_tree()
        assert tree is not None and not forged and "bigpkg/gen0.py" not in tree and len(tree) == 10
        assert tree["bigpkg/extra.py"] == "Y = 1\n" and "x * 2" in tree["bigpkg/core.py"]
        assert tree["bigpkg/gen1.py"] == env._snapshot()["bigpkg/gen1.py"]
        score = await env.reward(None)  # type: ignore[arg-type]
    finally:
        await env.close()
    assert score["total"] == 1.0 and score["unreadable"] == 0.0, score


async def test_a_package_padded_past_one_grading_call_is_a_zero_not_an_outage(sandbox) -> None:
    """Found by a red-team pass: one bash command writing 1.2 MB of `x = 1` lines into the
    package (it compresses 600:1, so it came back whole) made the grading call too large to run;
    counted as a report lost not by the solution, grade() raised SandboxUnavailable and the
    episode left its group's baseline as an outage, at the policy's will."""
    (task,) = SweEnv.load_tasks(limit=1)
    pad = "cd /tmp/repo && python3 -c \"open('convkit/pad.py', 'w').write('x = 1\\n' * 200000)\""
    env = await run_episode(sandbox, task, [pad], "pad")
    try:
        score = await env.reward(None)  # type: ignore[arg-type]
    finally:
        await env.close()
    assert score["total"] == 0.0 and score["pass_to_pass"] == 0.0, score


async def test_an_instance_too_large_to_grade_is_an_error_naming_the_fix(sandbox, tmp_path):
    """The same limit met by the instance's own sources (1.2 MB of them): no episode of it could
    score, so its reward raises (reward_error, counted) with the setting to raise."""
    task = big_instance(tmp_path, modules=45)
    env = await run_episode(sandbox, task, [FIX], "fix")
    try:
        with pytest.raises(RuntimeError, match="raise sandbox.server.max_code_bytes"):
            await env.reward(None)  # type: ignore[arg-type]
    finally:
        await env.close()


class GradingSpy(ServiceSandbox):
    """The real client, noting the service's live sessions at each grading call (no session)."""

    def __init__(self, url: str) -> None:
        super().__init__(url)
        self.live: list[int] = []

    async def run(self, code, language="python", timeout=10.0, session=None, image=None):
        if session is None:
            self.live.append((await self.health())["sessions"])
        return await super().run(code, language, timeout, session, image)


async def test_the_policys_processes_are_gone_before_its_checks_run(service) -> None:
    """Found by a red-team pass: the episode's session, with every process the policy left in
    it (a `setsid` daemon, a CPU spinner), lived on until after grading; its wall-timed checks,
    and those of the episodes graded beside it, ran against whatever it kept busy. The session
    is closed once the agent's files are read back, before the first check."""
    spy = GradingSpy(service.url)
    (task,) = SweEnv.load_tasks(limit=1)
    try:
        env = await run_episode(spy, task, ["setsid nohup sleep 1000 >/dev/null 2>&1 &"], "bg")
        try:
            assert (await spy.health())["sessions"] == 1
            score = await env.reward(None)  # type: ignore[arg-type]
        finally:
            await env.close()
    finally:
        await spy.aclose()
    assert score["pass_to_pass"] == 1.0 and spy.live and set(spy.live) == {0}, spy.live


class ForgedReadBack(ServiceSandbox):
    """The real client, answering the env's read-back as a session whose interpreter the policy
    rewrote would (from a bash call its /proc/<pid>/mem opens read-write): `pkg//name`."""

    async def run(self, code, language="python", timeout=10.0, session=None, image=None):
        res = await super().run(code, language, timeout, session, image)
        if "AGENTRL-TREE" not in code:
            return res
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w:gz") as t:
            data = b"def to_roman(n):\n    return 'MCMXCIV'\n"
            info = tarfile.TarInfo("convkit//convert.py")
            info.size = len(data)
            t.addfile(info, io.BytesIO(data))
        gone = base64.b64encode(b"[]").decode()
        line = f"AGENTRL-TREE {base64.b64encode(buf.getvalue()).decode()} {gone}\n"
        return res.model_copy(update={"stdout": line})


async def test_a_forged_read_back_is_tampering_and_graded_as_no_change(service) -> None:
    """A read-back holding a name none writes is the policy's rewrite of its session: graded as
    if nothing had changed, and said (`tampered`, so `reward/tampered` shows it)."""
    forger = ForgedReadBack(service.url)
    (task,) = SweEnv.load_tasks(limit=1)
    try:
        env = await run_episode(forger, task, ["true"], "forged")
        try:
            score = await env.reward(None)  # type: ignore[arg-type]
        finally:
            await env.close()
    finally:
        await forger.aclose()
    assert score["tampered"] == 1.0 and score["unreadable"] == 1.0, score
    assert score["total"] == 0.0 and score["pass_to_pass"] == 1.0, score
