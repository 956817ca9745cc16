"""The repository tools (`bash`, `str_replace_editor`, `submit`) on the real sandbox service:
the shell keeps its directory and variables between calls, cuts long output, survives a
timeout and restarts when it must; the editor's edits, refusals and undo; two episodes' shells
and files are apart; `submit` ends the episode after its turn."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from agentrl.env import AssistantTurn, ToolEnv
from agentrl.sandbox import Limits, ServerConfig, ServiceSandbox
from agentrl.sandbox.server import LocalService
from agentrl.tool import ToolContext
from agentrl.tools.editor import EditorTool
from agentrl.tools.shell import BashTool
from agentrl.tools.submit import SubmitTool
from agentrl.types import Message, Task, ToolCall


@pytest.fixture(scope="module")
def service() -> Iterator[LocalService]:
    cfg = ServerConfig(warm_workers=2, max_running=4, limits=Limits(wall_s=30, memory_mb=512))
    with LocalService(cfg) as svc:
        yield svc


def ctx(sandbox: ServiceSandbox, session: str, timeout: float = 3.0) -> ToolContext:
    return ToolContext(session=session, sandbox=sandbox, timeout_s=timeout)


@pytest.fixture
async def client(service: LocalService):
    sb = ServiceSandbox(service.url)
    yield sb
    await sb.aclose()


async def test_the_shell_persists_cuts_and_survives_timeouts(client: ServiceSandbox) -> None:
    c, bash = ctx(client, "shell"), BashTool(cwd="/tmp", max_output_chars=200)

    async def run(**args):
        return await bash.invoke(args, c)

    r = await run(command="mkdir -p work && cd work && export NAME=agent && echo ready")
    assert (r.content, r.is_error) == ("ready", False)
    r = await run(command="pwd; echo $NAME; ls /nonexistent")
    assert r.content.startswith("/tmp/work\nagent\nls: ") and r.content.endswith("[exit code 2]")
    assert not r.is_error and r.metadata["exit_code"] == 2  # a failing command is an answer
    assert (await run(command="cat")).content == "[no output]"  # stdin is at end of file
    r = await run(command="seq 1 100000")
    assert r.content.startswith("1\n2\n3\n") and r.content.endswith("99999\n100000")
    assert "bytes cut ...]" in r.content and len(r.content) < 300
    r = await run(command="sleep 30")  # the command is killed, the shell carries on
    assert r.is_error and "timed out after 3s: interrupted" in r.content
    assert (await run(command="echo $NAME $PWD")).content == "agent /tmp/work"
    r = await run(command="while true; do :; done")  # the shell itself is busy: a new one
    assert r.is_error and "the shell was restarted" in r.content
    assert (await run(command="echo ${NAME:-gone} $PWD")).content == "gone /tmp"
    r = await run(command="exit 4")
    assert "the shell exited with status 4" in r.content and r.metadata["exit_code"] == 4
    assert (await run(command="echo back")).content == "back"
    r = await run(command="echo 'unclosed")
    assert "unexpected EOF" in r.content and r.content.endswith("[exit code 2]")
    await run(command="export KEEP=1")
    r = await run(command="echo ${KEEP:-none}", restart=True)
    assert r.content == "none"
    r = await run()
    assert r.is_error and "give a command" in r.content


async def test_the_editor_edits_refuses_and_undoes(client: ServiceSandbox) -> None:
    c, ed = ctx(client, "editor"), EditorTool()

    async def edit(**args):
        return await ed.invoke(args, c)

    src = "def f(x):\n    return x + 1\n\n\ndef g(x):\n    return x + 1\n"
    r = await edit(command="create", path="/tmp/pkg/m.py", file_text=src)
    assert r.content == "Created /tmp/pkg/m.py (6 lines)"
    r = await edit(command="view", path="/tmp/pkg/m.py", view_range=[5, -1])
    assert r.content == "     5\tdef g(x):\n     6\t    return x + 1"
    r = await edit(command="str_replace", path="/tmp/pkg/m.py", old_str="return x + 1", new_str="")
    assert r.is_error and "occurs 2 times" in r.content and "[2, 6]" in r.content
    r = await edit(command="str_replace", path="/tmp/pkg/m.py", old_str="absent", new_str="x")
    assert r.is_error and "was not found" in r.content
    old, new = "def g(x):\n    return x + 1", "def g(x):\n    return x * 2"
    r = await edit(command="str_replace", path="/tmp/pkg/m.py", old_str=old, new_str=new)
    assert not r.is_error and "     6\t    return x * 2" in r.content
    r = await edit(command="insert", path="/tmp/pkg/m.py", insert_line=0, new_str="import os")
    assert "     1\timport os\n     2\tdef f(x):" in r.content
    assert (await edit(command="undo_edit", path="/tmp/pkg/m.py")).content.startswith("Undid")
    shell = await BashTool(cwd="/tmp/pkg").invoke(
        {"command": "python3 -c 'import m; print(m.g(5))'; head -1 m.py"}, c
    )
    assert shell.content == "10\ndef f(x):"  # the edits are the sandbox's files
    refusals = [
        {"command": "view", "path": "pkg/m.py"},  # relative
        {"command": "create", "path": "/tmp/pkg/m.py", "file_text": "x"},  # exists
        {"command": "view", "path": "/tmp/pkg/m.py", "view_range": [9, 12]},
        {"command": "insert", "path": "/tmp/pkg/m.py", "insert_line": 99, "new_str": "x"},
        {"command": "view", "path": "/nowhere"},
        {"command": "delete", "path": "/tmp/pkg/m.py"},  # not a command: the schema refuses
    ]
    for args in refusals:
        r = await ed.invoke(args, c)
        assert r.is_error and r.content.startswith("Error"), (args, r.content)
    assert (await edit(command="view", path="/tmp/pkg")).content.endswith("/tmp/pkg/m.py")


async def test_long_answers_at_the_default_caps_reach_the_model(client: ServiceSandbox) -> None:
    """Found by a red-team pass: an answer travelled as the session's trailing value, which the
    sandbox cuts at 8 KB; at the default 8,000 characters a long test log, `cat` of a 7 KB file
    or the editor's view of one repr'd past it ('\\n' and '\\t' are two characters there) and the
    model read 'Error: the shell did not answer: no answer'."""
    c = ctx(client, "long")
    r = await BashTool().invoke({"command": "seq 1 100000"}, c)
    assert not r.is_error and r.content.startswith("1\n2\n3\n") and r.content.endswith("100000")
    r = await BashTool().invoke({"command": "printf '\\001%.0s' $(seq 3000); echo; echo end"}, c)
    assert not r.is_error and r.content.endswith("end") and r.content.count("\x01") == 3000
    text = "".join(f"    x{i} = {i}\t# tab\n" for i in range(500))
    await EditorTool().invoke({"command": "create", "path": "/tmp/long.py", "file_text": text}, c)
    r = await EditorTool().invoke({"command": "view", "path": "/tmp/long.py"}, c)
    assert not r.is_error and "     1\t    x0 = 0" in r.content and "x499 = 499" in r.content


async def test_an_edit_keeps_the_files_line_ends(client: ServiceSandbox) -> None:
    """Found by a red-team pass: the editor read and wrote in text mode, so one str_replace in a
    CRLF file rewrote every line end to LF (the whole file in `git diff`) and a lone CR became a
    line break."""
    c, ed = ctx(client, "crlf"), EditorTool()
    show = "python3 -c \"import sys; print(open(sys.argv[1], 'rb').read())\" "
    await BashTool().invoke(
        {"command": "printf 'a = 1\\r\\nb = 2\\r\\nc = 3\\r\\n' > /tmp/w.py"}, c
    )
    await BashTool().invoke({"command": "printf 'x = 1\\ny = \"\\r\"\\n' > /tmp/cr.py"}, c)
    old, new = "a = 1\nb = 2", "a = 1\nb = 20\nb2 = 0"
    r = await ed.invoke(
        {"command": "str_replace", "path": "/tmp/w.py", "old_str": old, "new_str": new}, c
    )
    assert not r.is_error and "     3\tb2 = 0" in r.content
    await ed.invoke({"command": "insert", "path": "/tmp/w.py", "insert_line": 4, "new_str": "d"}, c)
    r = await BashTool().invoke({"command": show + "/tmp/w.py"}, c)
    assert r.content == "b'a = 1\\r\\nb = 20\\r\\nb2 = 0\\r\\nc = 3\\r\\nd\\r\\n'"
    await ed.invoke({"command": "undo_edit", "path": "/tmp/w.py"}, c)
    await ed.invoke({"command": "undo_edit", "path": "/tmp/w.py"}, c)
    r = await BashTool().invoke({"command": show + "/tmp/w.py"}, c)
    assert r.content == "b'a = 1\\r\\nb = 2\\r\\nc = 3\\r\\n'"
    await ed.invoke(
        {"command": "str_replace", "path": "/tmp/cr.py", "old_str": "x = 1", "new_str": "x = 2"}, c
    )
    r = await BashTool().invoke({"command": show + "/tmp/cr.py"}, c)
    assert r.content == "b'x = 2\\ny = \"\\r\"\\n'"


async def test_an_old_str_found_many_times_is_answered_briefly(client: ServiceSandbox) -> None:
    """Found by a red-team pass: every match's line was listed, each counted from the top: a
    one-character old_str in a 200,000-line file ran past the call's time, and in a 30,000-line
    one the answer outgrew the sandbox's output; the model read 'did not answer' either way."""
    c, ed = ctx(client, "many"), EditorTool()
    make = "python3 -c \"open('/tmp/many.py', 'w').write('a = 1\\n' * 200000)\""
    await BashTool().invoke({"command": make}, c)
    r = await ed.invoke({"command": "str_replace", "path": "/tmp/many.py", "old_str": "a"}, c)
    assert r.is_error and "occurs 200000 times" in r.content, r.content
    assert "(lines [1, 2, 3," in r.content and "20, ...]); nothing was replaced" in r.content


async def test_the_editor_refuses_what_it_cannot_read_whole(client: ServiceSandbox) -> None:
    """Found by a red-team pass: view read any path whole: /dev/zero filled the session's
    memory, whose interpreter was killed and with it the episode's files (the repository the
    agent had edited), and a FIFO held the call to its timeout."""
    c, ed = ctx(client, "special"), EditorTool()
    setup = "echo kept > /tmp/kept && mkfifo /tmp/fifo && head -c 12000000 /dev/zero > /tmp/big"
    await BashTool().invoke({"command": setup}, c)
    for path, why in [
        ("/dev/zero", "not a regular file"),
        ("/tmp/fifo", "not a regular file"),
        ("/tmp/big", "is 12000000 bytes, past the editor's"),
    ]:
        r = await ed.invoke({"command": "view", "path": path}, c)
        assert r.is_error and why in r.content, (path, r.content)
    r = await ed.invoke({"command": "str_replace", "path": "/tmp/big", "old_str": "x"}, c)
    assert r.is_error and "past the editor's" in r.content
    assert (await BashTool().invoke({"command": "cat /tmp/kept"}, c)).content == "kept"


async def test_an_edit_the_file_cannot_hold_leaves_it_as_it_was(client: ServiceSandbox) -> None:
    """Found by a red-team pass: a new_str with a lone surrogate (JSON's "\\ud800") raised
    while writing, after the file was opened for writing: the edited file was left empty."""
    c, ed = ctx(client, "surrogate"), EditorTool()
    path = "/tmp/s.py"
    await ed.invoke({"command": "create", "path": path, "file_text": "x = 1\n"}, c)
    args = {"command": "str_replace", "path": path, "old_str": "x = 1", "new_str": "x = '\ud800'"}
    r = await ed.invoke(args, c)
    assert r.is_error and r.content.startswith("Error: UnicodeEncodeError"), r.content
    r = await ed.invoke(
        {"command": "insert", "path": path, "insert_line": 0, "new_str": "\udc80"}, c
    )
    assert r.is_error and r.content.startswith("Error: UnicodeEncodeError"), r.content
    assert (await BashTool().invoke({"command": f"cat {path}"}, c)).content == "x = 1"
    # the same in a command: an error that says so, not the session's traceback
    r = await BashTool().invoke({"command": "echo '\ud800'"}, c)
    assert r.is_error and "not UTF-8 text" in r.content and "Traceback" not in r.content
    assert (await BashTool().invoke({"command": "echo ok"}, c)).content == "ok"


async def test_a_command_beside_a_flooding_background_job_ends_ok(client: ServiceSandbox) -> None:
    """Found by a red-team pass: beside a background job printing as fast as the pipe took it,
    the end-of-command marker was missed (only the last 4 KB of each 64 KB read were searched,
    and bash wrote the newline before the marker apart from it, the job's output in between),
    so a command that had finished was reported timed out after the whole timeout and the shell
    restarted, its directory and variables lost. `head -c` bounds each flood to 40 MB."""
    c = ctx(client, "flood", timeout=20.0)
    bash = BashTool(max_output_chars=400)
    await bash.invoke({"command": "cd /tmp && export KEPT=1"}, c)
    for _ in range(4):
        r = await bash.invoke({"command": "(yes flood | head -c 40000000 &); echo started"}, c)
        assert not r.is_error and r.metadata["state"] == "ok", (r.metadata, r.content[-300:])
        for _ in range(3):
            r = await bash.invoke({"command": "echo done $KEPT"}, c)
            assert not r.is_error and r.metadata["state"] == "ok", (r.metadata, r.content[-300:])
            assert len(r.content) < 600, r.content
    await bash.invoke({"command": "pkill -x yes; pkill -x head; true"}, c)
    assert (await bash.invoke({"command": "echo $PWD $KEPT"}, c)).content.endswith("/tmp 1")


async def test_two_episodes_have_their_own_shell_and_files(client: ServiceSandbox) -> None:
    a, b = ctx(client, "episode-a"), ctx(client, "episode-b")
    await BashTool().invoke({"command": "cd /tmp && echo secret-a > mine.txt && export W=a"}, a)
    r = await BashTool().invoke({"command": "cat /tmp/mine.txt; echo ${W:-unset}"}, b)
    assert "No such file" in r.content and r.content.splitlines()[-1] == "unset"


class _RepoEnv(ToolEnv):
    tools = [BashTool(), SubmitTool()]


async def test_submit_ends_the_episode_after_its_turn(client: ServiceSandbox) -> None:
    env = _RepoEnv(Task(id="t", data={"prompt": "go"}), ctx(client, "submit"))

    def turn(*calls: ToolCall) -> AssistantTurn:
        return AssistantTurn(Message(role="assistant", content="", tool_calls=list(calls)), "")

    bash = ToolCall(id="1", name="bash", arguments={"command": "echo hi"})
    assert not (await env.step(turn(bash))).done
    res = await env.step(turn(bash, ToolCall(id="2", name="submit", arguments={"message": "ok"})))
    assert res.done and res.stop_reason is None and res.messages[-1].content == "Submitted."
    await env.close()
