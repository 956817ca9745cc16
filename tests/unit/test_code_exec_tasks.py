"""code_exec's tasks, found by a red-team pass on bad input: an answer of a task file the reward
cannot compare (2.0 was compared as "2.0" and never matched; a missing one made every episode's
reward raise), and generator options that were ignored or read as others."""

from __future__ import annotations

import json

import pytest

from agentrl.env_config import EnvConfig
from agentrl.envs.code_exec import CodeExecEnv
from agentrl.envs.examples.units import UnitsEnv
from agentrl.types import ConfigError


def _load(cls, **tasks):
    return EnvConfig(_target_="x", tasks=tasks).load_tasks(cls)


def _file(tmp_path, *rows):
    path = tmp_path / "tasks.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


@pytest.mark.parametrize(
    ("answer", "said"),
    [(2.0, "has the answer 2.0"), (True, "has the answer True"), (None, "has the answer None"),
     ([1], r"has the answer \[1\]"), ("missing", "has no 'answer'")],
)  # fmt: skip
def test_a_code_exec_answer_the_reward_cannot_compare_is_refused(tmp_path, answer, said):
    row = {"id": "a", "prompt": "p"} | ({} if answer == "missing" else {"answer": answer})
    with pytest.raises(ConfigError, match=rf"task 'a' {said}: give each task an 'answer', the "
                       r"text the model must reply in <answer></answer>"):  # fmt: skip
        _load(CodeExecEnv, path=_file(tmp_path, row))
    ok = _file(tmp_path, {"id": "a", "prompt": "p", "answer": 12}, {"prompt": "q", "answer": "x"})
    assert [t.data["answer"] for t in _load(CodeExecEnv, path=ok)] == [12, "x"]


def test_code_exec_generator_takes_limit_and_refuses_no_kinds():
    """limit was ignored without a path (256 tasks for limit=5), kinds=[] meant all six kinds."""
    assert len(_load(CodeExecEnv, n=20, limit=5)) == 5
    with pytest.raises(ConfigError, match=r"limit=0: give 1 or more"):
        _load(CodeExecEnv, n=20, limit=0)
    with pytest.raises(ConfigError, match=r"kinds=\[\] names no kind: give some of"):
        _load(CodeExecEnv, kinds=[])
    assert len(_load(UnitsEnv, n=3)) == 3
