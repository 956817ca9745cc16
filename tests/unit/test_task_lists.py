"""What a task list may hold: tasks with ids of their own, at least one (whatever load_tasks
made them: a JSONL file, a user's own loader, a mixture's member)."""

import pytest

from agentrl.env_config import EnvConfig
from agentrl.envs.code_exec import CodeExecEnv
from agentrl.types import ConfigError, Task


class SameIds(CodeExecEnv):
    @classmethod
    def load_tasks(cls, n: int = 3) -> list[Task]:
        return [Task(id="q", data={"prompt": f"{i} + 1?", "answer": str(i + 1)}) for i in range(n)]


def _load(cls, where="env", **tasks):
    return EnvConfig(_target_="x", tasks=tasks).load_tasks(cls, where=where)


def test_tasks_sharing_an_id_are_refused_with_the_id_and_the_fix(tmp_path):
    """Found by a red-team pass: a JSONL file whose lines repeat an id (or leave it out, or set
    it null, which became the line number or 'None') loaded without a word; the held-out split
    then dropped every training task sharing an evaluation task's id, and a re-issued group
    could be rolled out on another task of that id."""
    path = tmp_path / "dup.jsonl"
    path.write_text('{"id": "a", "prompt": "x", "answer": "1"}\n'
                    '{"id": "a", "prompt": "y", "answer": "2"}\n')  # fmt: skip
    with pytest.raises(ConfigError, match=r"env\.tasks: .*2 tasks share the id 'a'.*own id"):
        _load(CodeExecEnv, path=str(path))
    path.write_text('{"prompt": "x", "answer": "1"}\n{"id": "0", "prompt": "y", "answer": "2"}\n')
    with pytest.raises(ConfigError, match=r"share the id '0'"):
        _load(CodeExecEnv, path=str(path))
    with pytest.raises(ConfigError, match=r"env\.envs\.mine\.tasks: SameIds\.load_tasks.*'q'"):
        _load(SameIds, where="env.envs.mine")
    assert [t.id for t in _load(SameIds, n=1)] == ["q"]


def test_a_loader_that_returns_no_tasks_names_its_section():
    """It was a ValueError traceback saying 'check env.tasks', also for a mixture's member."""
    with pytest.raises(ConfigError, match=r"env\.envs\.mine\.tasks: SameIds\.load_tasks.*no tasks"):
        _load(SameIds, where="env.envs.mine", n=0)


@pytest.mark.parametrize(
    "lines,expect",
    [
        (b'{"id": "a", "prompt": "x"}\n[1, 2]\n', r"jsonl line 2: a JSON array, not an object"),
        (b'{"id": "a", "prompt": "x"}\n3\n', r"jsonl line 2: a JSON number, not an object"),
        (b'{"id": "a"}\n\n{"id": "b", prompt}\n', r"jsonl line 3: not JSON \(Expecting property"),
        (b'{"id": "a"}\n{"id": "caf\xe9"}\n', r"jsonl line 2: not UTF-8 .*save the file as UTF-8"),
    ],
)
def test_a_bad_line_of_a_jsonl_file_is_named_by_its_number(tmp_path, lines, expect):
    """Found by a red-team pass: a line that was JSON but no object was a TypeError or
    AttributeError traceback, and a line that was no JSON was reported as 'line 1' whatever its
    place in the file (json's own count, of the one line it read)."""
    path = tmp_path / "t.jsonl"
    path.write_bytes(lines)
    with pytest.raises(ConfigError, match=r"env\.tasks: CodeExecEnv\.load_tasks: .*t\." + expect):
        _load(CodeExecEnv, path=str(path))


def test_a_jsonl_file_with_a_bom_or_windows_line_ends_loads(tmp_path):
    """A BOM (Windows editors, Excel's 'UTF-8' export) was refused as bad JSON on line 1."""
    path = tmp_path / "t.jsonl"
    path.write_bytes('\ufeff{"id": "a", "prompt": "x", "answer": "1"}\r\n'
                     '{"id": "b", "prompt": "é", "answer": "2"}\r\n'.encode())  # fmt: skip
    assert [(t.id, t.data["prompt"]) for t in _load(CodeExecEnv, path=str(path))] == [
        ("a", "x"),
        ("b", "é"),
    ]


def test_a_jsonl_limit_below_one_is_refused(tmp_path):
    """env.tasks.limit=0 loaded one task (the limit was checked after the first was kept)."""
    path = tmp_path / "t.jsonl"
    path.write_text('{"id": "a", "prompt": "x", "answer": "1"}\n{"id": "b", "prompt": "y"}\n')
    assert [t.id for t in _load(CodeExecEnv, path=str(path), limit=1)] == ["a"]
    with pytest.raises(ConfigError, match=r"limit=0: .*1 or more"):
        _load(CodeExecEnv, path=str(path), limit=0)
