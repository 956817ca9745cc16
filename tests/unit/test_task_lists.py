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
