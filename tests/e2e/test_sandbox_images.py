"""Sandboxes from images (sandbox/images.py) on the real service: two images built offline from
this host's Debian packages (one with a wheel of its own) run sessions that see their own root
filesystem only, never each other's files or the host's; writes land in a throw-away overlay
(the session keeps them, the next one and the image on disk never see them); the image's own
interpreter runs the code; escapes from the root (the host's files, the service's loopback,
other processes, privileges, writing the image's files) fail; a session stays in its image; the
SWE env runs in an image with git (its reference patch scores 1.0, doing nothing 0.0)."""

from __future__ import annotations

import json
import shutil
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from agentrl.sandbox import Limits, ServerConfig, ServiceSandbox
from agentrl.sandbox.images import build_image
from agentrl.sandbox.server import LocalService

BASE = ["python3.11-minimal", "libpython3.11-stdlib", "bash", "coreutils"]


def _wheel(tmp: Path) -> str:
    path = tmp / "imgmark-1.0-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("imgmark.py", "WHO = 'image b'\n")
        z.writestr("imgmark-1.0.dist-info/METADATA", "Name: imgmark\nVersion: 1.0\n")
    return str(path)


@pytest.fixture(scope="module")
def images(tmp_path_factory) -> dict[str, Path]:
    if shutil.which("dpkg-query") is None:
        pytest.skip("build_image reads Debian packages: this host has no dpkg")
    tmp = tmp_path_factory.mktemp("wheels")
    return {"a": build_image(BASE, name="test-a"), "b": build_image(BASE, [_wheel(tmp)], "test-b"),
            "git": build_image([*BASE, "git"], name="test-git")}  # fmt: skip


@pytest.fixture(scope="module")
def service(images) -> Iterator[LocalService]:
    cfg = ServerConfig(warm_workers=1, images={k: str(v) for k, v in images.items()},
                       limits=Limits(wall_s=10, memory_mb=256))  # fmt: skip
    with LocalService(cfg) as svc:
        if svc.health()["isolation"]["mode"] != "bwrap":
            pytest.skip("images need bwrap isolation")
        yield svc


@pytest.fixture
async def sb(service: LocalService):
    client = ServiceSandbox(service.url)
    yield client
    await client.aclose()


LOOK = """
import json, os, sys
def can(f):
    try:
        f()
        return True
    except Exception:
        return False
try:
    import imgmark
    mark = imgmark.WHO
except ImportError:
    mark = None
print(json.dumps({"python": sys.executable, "version": sys.version.split()[0], "mark": mark,
    "uid": os.getuid(), "root": sorted(os.listdir("/")),
    "mine": os.path.exists("/scratch/mine"), "tmp_mine": os.path.exists("/tmp/mine"),
    "host_python": os.path.exists("/root/.pyenv"), "work": os.path.exists("/work"),
    "image_json": os.path.exists("/.agentrl-image.json")}))
"""


async def look(sb: ServiceSandbox, **where) -> dict:
    res = await sb.run(LOOK, **where)
    assert res.ok, res.stderr
    return json.loads(res.stdout)


async def test_sessions_see_their_own_image_and_nothing_else(sb, images) -> None:
    host = await look(sb)
    a, b = await look(sb, image="a"), await look(sb, image="b")
    assert a["python"] == b["python"] == "/usr/bin/python3"  # the image's interpreter
    assert host["python"] != a["python"] and host["host_python"] and not host["image_json"]
    assert (a["mark"], b["mark"], host["mark"]) == (None, "image b", None)
    for seen in (a, b):
        assert seen["image_json"] and not seen["host_python"] and not seen["work"]
        assert seen["uid"] == 1000
    # writes: kept by the session, unseen by another session of the same image and by the image
    sb.use_image("writer", "a")
    made = (
        "import os\nos.makedirs('/scratch', exist_ok=True)\nopen('/scratch/mine', 'w').write('1')"
    )
    assert (await sb.run(made + "\nopen('/tmp/mine', 'w').write('1')", session="writer")).ok
    assert (await look(sb, session="writer"))["mine"]
    other = await look(sb, image="a")
    assert not other["mine"] and not other["tmp_mine"]
    assert not (images["a"] / "scratch").exists()
    await sb.close_session("writer")
    with pytest.raises(ValueError, match="unknown image"):
        await sb.run("1", image="nope")
    sb.use_image("bound", "a")
    await sb.run("x = 1", session="bound")
    with pytest.raises(ValueError, match="runs in image 'a'"):
        await sb.run("x", session="bound", image="b")
    await sb.close_session("bound")


ESCAPES = {
    # the image's own files are not the sandbox user's to change
    "write_the_image": "open('/usr/bin/python3.11', 'ab').write(b'x')",
    "become_root": "import os; os.setuid(0)",
    "mount": "import ctypes; assert ctypes.CDLL(None).mount(b'none', b'/mnt', b'tmpfs', 0, None) == 0",
    "host_root_via_proc": "import os; assert '.pyenv' in os.listdir('/proc/1/root/root')",
    "service_loopback": "import socket; socket.create_connection(('127.0.0.1', PORT), timeout=2)",
    "another_process": "import os; assert len([p for p in os.listdir('/proc') if p.isdigit()]) > 3",
}


@pytest.mark.parametrize("name", sorted(ESCAPES))
async def test_escapes_from_an_image_fail(sb, service, name: str) -> None:
    code = ESCAPES[name].replace("PORT", str(service.url.rsplit(":", 1)[1]))
    res = await sb.run(code, image="a")
    assert not res.ok, (name, res)
    assert (await sb.run("print('ok')", image="a")).stdout == "ok\n"  # and it serves the next


async def test_the_swe_env_runs_and_grades_in_an_image(sb) -> None:
    from agentrl.env import AssistantTurn
    from agentrl.envs.swe import SweEnv
    from agentrl.tool import ToolContext
    from agentrl.types import Message, ToolCall

    for task in SweEnv.load_tasks(limit=3):
        for fix in (True, False):
            ctx = ToolContext(session=f"{task.id}-{fix}", sandbox=sb, timeout_s=20)
            env = SweEnv(task, ctx, image="git")
            await env.start()
            cmd = "cd /tmp/repo && python3 --version && git log --oneline | wc -l"
            if fix:
                cmd += f" && git apply <<'EOF'\n{task.data['patch']}EOF"
            calls = [ToolCall(id="1", name="bash", arguments={"command": cmd})]
            said = await env.step(AssistantTurn(Message(role="assistant", content="",
                                                        tool_calls=calls), ""))  # fmt: skip
            assert said.messages[0].content.startswith("Python 3.11.2\n1"), said.messages[0]
            reward = await env.reward(None)  # type: ignore[arg-type]
            await env.close()
            assert reward["total"] == (1.0 if fix else 0.0), (task.id, fix, reward)

    # gaming the grader from inside the image: the tests rewritten, a conftest.py, an import-time
    # exit in the package (tests/e2e/test_swe_env.py's hacks) and files written into the image
    from test_swe_env import HACKS

    task = SweEnv.load_tasks(limit=1)[0]
    env = SweEnv(task, ToolContext(session="hack", sandbox=sb, timeout_s=20), image="git")
    await env.start()
    hacks = [*HACKS, "mkdir -p /usr/lib/python3/dist-packages 2>&1; echo 'x' > /sitecustomize.py"]
    calls = [
        ToolCall(id=str(i), name="bash", arguments={"command": c}) for i, c in enumerate(hacks)
    ]
    await env.step(AssistantTurn(Message(role="assistant", content="", tool_calls=calls), ""))
    reward = await env.reward(None)  # type: ignore[arg-type]
    await env.close()
    assert reward["total"] == 0.0 and reward["fail_to_pass"] == 0.0, reward
