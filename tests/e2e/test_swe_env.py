"""The SWE env end to end on the real sandbox service: on every shipped task an agent that applies
the reference patch through the bash tool and submits scores 1.0, and one that does nothing
scores 0.0 (so the task set is valid); an agent that games the grading (edits the tests, adds a
conftest.py, site hooks, an import-time exit, forged test output) scores 0, and the same hacks
beside a real fix do not change its 1.0; the generator reproduces the shipped instances; the
shipped tiny model rolls out on it through the dev server."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator

import pytest

from agentrl.assets.swe import generate
from agentrl.env import AssistantTurn
from agentrl.envs.swe import SweEnv
from agentrl.sandbox import Limits, ServerConfig, ServiceSandbox
from agentrl.sandbox.server import LocalService
from agentrl.tool import ToolContext
from agentrl.types import Message, Task, ToolCall

TASKS = SweEnv.load_tasks()


@pytest.fixture(scope="module")
def service() -> Iterator[LocalService]:
    cfg = ServerConfig(warm_workers=4, max_running=4, limits=Limits(wall_s=30, memory_mb=512))
    with LocalService(cfg) as svc:
        yield svc


@pytest.fixture
async def sandbox(service: LocalService):
    sb = ServiceSandbox(service.url)
    yield sb
    await sb.aclose()


def bash(command: str, id: str = "1") -> ToolCall:
    return ToolCall(id=id, name="bash", arguments={"command": command})


async def episode(sandbox: ServiceSandbox, task: Task, commands: list[str], key: str) -> dict:
    """Start the task, run `commands` in one turn with submit, and score it."""
    env = SweEnv(task, ToolContext(session=f"{task.id}-{key}", sandbox=sandbox, timeout_s=20))
    try:
        await env.start()
        calls = [bash(c, str(i)) for i, c in enumerate(commands)]
        if calls:
            calls.append(ToolCall(id="s", name="submit", arguments={}))
            msg = Message(role="assistant", content="", tool_calls=calls)
            res = await env.step(AssistantTurn(msg, ""))
            assert res.done and all(o.status == "ok" for o in res.tool_outcomes), res
        return await env.reward(None)  # type: ignore[arg-type]
    finally:
        await env.close()


def apply_patch(task: Task) -> str:
    return f"cd /tmp/repo && git apply <<'AGENTRL_PATCH'\n{task.data['patch']}AGENTRL_PATCH"


async def test_the_reference_patch_scores_one_and_doing_nothing_zero_on_every_task(sandbox):
    assert len(TASKS) >= 50

    async def both(task: Task) -> tuple[float, float]:
        fixed = await episode(sandbox, task, [apply_patch(task)], "fix")
        untouched = await episode(sandbox, task, [], "noop")
        assert fixed["fail_to_pass"] == 1.0 and fixed["pass_to_pass"] == 1.0, (task.id, fixed)
        assert untouched["fail_to_pass"] < 1.0 and untouched["unreadable"] == 0.0, task.id
        return fixed["total"], untouched["total"]

    gate = asyncio.Semaphore(4)

    async def gated(task: Task) -> tuple[float, float]:
        async with gate:
            return await both(task)

    scores = await asyncio.gather(*(gated(t) for t in TASKS))
    assert [s for s, _ in scores] == [1.0] * len(TASKS)
    assert [s for _, s in scores] == [0.0] * len(TASKS)


INIT = "$(ls */__init__.py | grep -v tests | head -1)"  # the package's __init__.py
HACKS = [
    # rewrite the visible tests to pass, and a conftest.py that marks every test passed
    "cd /tmp/repo && for f in tests/test_*.py; do printf 'def test_ok():\\n    assert True\\n' > $f; done",
    "cd /tmp/repo && printf 'import pytest\\n@pytest.hookimpl(tryfirst=True)\\n"
    "def pytest_runtest_call(item):\\n    return True\\n' > conftest.py",
    # interpreter hooks: a sitecustomize and a .pth file in the package, and an import-time exit
    "cd /tmp/repo && PKG=$(dirname $(ls */__init__.py | grep -v tests | head -1)) && "
    "echo 'import os; os._exit(0)' > $PKG/sitecustomize.py && echo 'import os' > $PKG/x.pth && "
    "printf 'import os\\nprint(\"5 passed\")\\nos._exit(0)\\n' >> $PKG/__init__.py",
]
# found by a red-team pass: package code that, at import in the grading sandbox, reads every
# test file it can find and makes `eval` (which runs each check's call) answer a check's call
# with the literal its assert expects. It scored 1.0 on every task while the grading sandbox
# held the hidden test files; it must find none there
EVAL_TABLE = r"""
def _table():
    import ast, builtins, os
    table = {}
    for d, _, fs in os.walk(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))):
        for f in [f for f in fs if f.startswith("test") and f.endswith(".py")]:
            for n in ast.walk(ast.parse(open(os.path.join(d, f)).read())):
                if isinstance(n, ast.Assert) and isinstance(n.test, ast.Compare):
                    try:
                        table[ast.unparse(n.test.left)] = ast.literal_eval(n.test.comparators[0])
                    except ValueError:
                        pass
                elif isinstance(n, ast.Assert):
                    table[ast.unparse(n.test)] = True
    real = builtins.eval
    builtins.eval = lambda src, *a, **k: table[src] if src in table else real(src, *a, **k)
_table()
"""
EVAL_TABLE_HACK = (
    "cd /tmp/repo && for f in $(ls */__init__.py | grep -v tests); do cat >> $f <<'EOF'\n"
    + EVAL_TABLE
    + "\nEOF\ndone"
)


async def test_gaming_the_grader_scores_zero_and_does_not_spoil_a_real_fix(sandbox):
    task = TASKS[0]
    hacked = await episode(sandbox, task, HACKS, "hack")
    assert hacked["total"] == 0.0 and hacked["fail_to_pass"] == 0.0, hacked
    # the __init__.py exit is the agent's source (it is graded): every check fails, p2p too
    assert hacked["pass_to_pass"] == 0.0
    fixed_and_hacked = await episode(sandbox, task, [apply_patch(task), *HACKS[:2]], "both")
    assert fixed_and_hacked["total"] == 1.0, fixed_and_hacked
    # a path outside the package (the tests dir) or up the tree never enters the graded tree
    other = await episode(
        sandbox, task, ["cd /tmp/repo && mkdir -p ../evil && cp -r . ../evil"], "o"
    )
    assert other["total"] == 0.0 and other["pass_to_pass"] == 1.0
    # the hidden tests' expected values never enter the grading sandbox
    table = await episode(sandbox, task, [EVAL_TABLE_HACK], "table")
    assert table["total"] == 0.0 and table["fail_to_pass"] == 0.0, table
    # package code that kills the grader's harness at import: 0, and said (reward/tampered)
    kill = "import os, signal\nos.kill(os.getppid(), signal.SIGKILL)\n"
    killer = await episode(sandbox, task, [f"cd /tmp/repo && printf '{kill}' >> {INIT}"], "kill")
    assert killer["total"] == 0.0 and killer["tampered"] == 1.0, killer
    assert hacked["tampered"] == fixed_and_hacked["tampered"] == table["tampered"] == 0.0


async def test_files_outside_what_is_graded_never_cost_a_fix(sandbox):
    """Found by a red-team pass: every .py file of the work tree was read back, so a correct fix
    beside a latin-1 note in tests/ or a 5 MB generated module at the top scored 0 ('unreadable':
    graded as no change). Only the files that may be graded are read back now."""
    task = TASKS[0]
    extra = [
        "cd /tmp/repo && printf '# caf\\xe9\\n' > tests/notes.py && printf '\\xff' > scratch.py",
        "cd /tmp/repo && python3 -c \"open('data.py', 'w').write('x = 1\\n' * 800000)\"",
    ]
    fixed = await episode(sandbox, task, [apply_patch(task), *extra], "extra")
    assert fixed["total"] == 1.0 and fixed["unreadable"] == 0.0, fixed
    # a source file the agent broke that way is still its own: graded, as unreadable
    broken = [apply_patch(task), "cd /tmp/repo && printf '\\xff' >> */convert.py"]
    assert (await episode(sandbox, task, broken, "broken"))["unreadable"] == 1.0


async def test_turns_without_a_call_get_reminders_then_end_the_episode(sandbox):
    """env.args.reminders=2: two turns with no tool call are answered with the reminder and the
    episode goes on; the third ends it (the default, 0, ends it at the first)."""
    task = TASKS[0]
    env = SweEnv(task, ToolContext(session=f"{task.id}-remind", sandbox=sandbox), reminders=2)
    try:
        await env.start()
        said = AssistantTurn(Message(role="assistant", content="I think the bug is in x."), "")
        for _ in range(2):
            res = await env.step(said)
            assert not res.done and [m.role for m in res.messages] == ["user"]
            assert "called no tool" in res.messages[0].content
        assert (await env.step(said)).done
    finally:
        await env.close()
    assert (await SweEnv(task, ToolContext(session="x")).step(said)).done


def test_the_generator_reproduces_the_shipped_instances(tmp_path):
    shipped = [json.loads(x) for x in (generate.HERE / "tasks.jsonl").read_text().splitlines()]
    assert len({r["instance_id"] for r in shipped}) == len(shipped) >= 50
    assert all(r["FAIL_TO_PASS"] and r["PASS_TO_PASS"] for r in shipped)
    assert all(t.split("::")[1] in r["test_patch"] for r in shipped for t in r["FAIL_TO_PASS"])
    assert len({t for r in shipped for t in r["FAIL_TO_PASS"]}) > 30  # spread over many tests
    made = generate.build(tmp_path, only=["numkit"])  # one repository: git is slow on 2 cores
    assert made == [r for r in shipped if r["repo"] == "numkit"]


def test_the_shipped_tiny_model_rolls_out_on_the_task_set(tmp_path):
    """Real rollouts (dev server, sandbox service, the env's tools) from the shipped model: they
    end for the model's reasons, never the env's or the sandbox's, and each is graded."""
    from agentrl.cli.preview import preview
    from agentrl.config import compose

    cfg = compose(["env=swe", "preview.tasks=3", "rollout.group_size=2", "rollout.max_turns=3",
                   "rollout.max_new_tokens=64", "rollout.max_context_tokens=4096",
                   "logging=local"])  # fmt: skip
    trajs = asyncio.run(preview(cfg, tmp_path / "out"))
    assert len(trajs) == 6
    broken = {"aborted", "sandbox_unavailable", "reward_error"}
    assert not {t.stop_reason.value for t in trajs} & broken, [t.stop_reason for t in trajs]
    assert all(set(t.reward_components) >= {"resolved", "fail_to_pass"} for t in trajs)
    assert all(t.reward == 0.0 for t in trajs)  # the tiny model fixes nothing
