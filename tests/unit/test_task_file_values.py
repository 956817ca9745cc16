"""What a task file's lines may hold, found by a red-team pass on bad input: values that loaded
without a word and were misread later (an id of null became "None", a prompt given as a list
of chat messages was sent as its Python repr, a key given twice kept only its last value)."""

from __future__ import annotations

import json

import pytest

from agentrl.env_config import EnvConfig
from agentrl.envs.code_exec import CodeExecEnv
from agentrl.types import ConfigError


def _load(cls, **tasks):
    return EnvConfig(_target_="x", tasks=tasks).load_tasks(cls)


def _file(tmp_path, *rows, name="tasks.jsonl"):
    path = tmp_path / name
    text = "".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows)
    path.write_text(text)
    return str(path)


@pytest.mark.parametrize(
    ("task_id", "said"),
    [(None, "null is a JSON null"), ({"a": 1}, r'\{"a": 1\} is a JSON object'),
     (1.0, "1.0 is a JSON number"), ("", '"" is an empty string'), (True, "true is a JSON true/false")],
)  # fmt: skip
def test_an_id_that_is_not_text_or_an_integer_is_refused_with_its_line(tmp_path, task_id, said):
    path = _file(tmp_path, {"id": "a", "prompt": "p", "answer": "1"},
                 {"id": task_id, "prompt": "q", "answer": "2"})  # fmt: skip
    with pytest.raises(ConfigError, match=rf"tasks\.jsonl line 2: the id {said}: give each task "
                       r"an id that is a non-empty string or an integer"):  # fmt: skip
        _load(CodeExecEnv, path=path)


def test_string_integer_and_missing_ids_still_load(tmp_path):
    path = _file(tmp_path, {"id": "a", "prompt": "p", "answer": "1"},
                 {"id": 7, "prompt": "q", "answer": "2"}, {"prompt": "r", "answer": 3})  # fmt: skip
    assert [t.id for t in _load(CodeExecEnv, path=path)] == ["a", "7", "2"]


@pytest.mark.parametrize(
    ("line", "said"),
    [('{"id": "a", "prompt": "p", "answer": "1", "answer": "2"}',
      r"line 1: the key 'answer' twice in one object \(JSON keeps only the last\)"),
     ('{"id": "a", "prompt": "p", "answer": NaN}', r"line 1: NaN is not JSON"),
     ('{"id": "a", "prompt": "p", "answer": "1", "meta": {"x": Infinity}}', "Infinity is not")],
)  # fmt: skip
def test_a_line_python_reads_but_json_does_not_mean_is_refused(tmp_path, line, said):
    with pytest.raises(ConfigError, match=said):
        _load(CodeExecEnv, path=_file(tmp_path, line))


@pytest.mark.parametrize("name", ["tasks.json", "tasks.parquet"])
def test_a_json_array_or_parquet_file_is_told_what_is_read(tmp_path, name):
    path = tmp_path / name
    path.write_text(json.dumps([{"id": "a", "prompt": "p", "answer": "1"}], indent=1))
    with pytest.raises(ConfigError, match=rf"line 1: not JSON .*\({name} is read as JSON Lines, "
                       r"one task object a line; convert"):  # fmt: skip
        _load(CodeExecEnv, path=str(path))


@pytest.mark.parametrize(
    ("prompt", "said"),
    [(5, r"a 'prompt' that is not text \(5\)"), (None, r"a 'prompt' that is not text \(None\)"),
     ([{"role": "user", "content": "hi"}], r"a 'prompt' that is not text \(\[\{'role'.*a list of messages: send "
      r"them from start\(\)"), ("  ", "an empty 'prompt'")],
)  # fmt: skip
def test_a_prompt_toolenv_cannot_send_as_text_is_refused(tmp_path, prompt, said):
    path = _file(tmp_path, {"id": "a", "prompt": prompt, "answer": "1"})
    with pytest.raises(ConfigError, match=rf"env\.tasks: task 'a' has {said}"):
        _load(CodeExecEnv, path=path)
