"""A user's SWE instances (env=swe env.tasks.path=…), found by a red-team pass on bad input:
each wrong field is refused at the door with its file, line and fix. Before, a line that was
an array was an AttributeError traceback, a bad line or a BOM a JSON error with no line; an
empty FAIL_TO_PASS scored every episode 0; a problem statement that was not text, an image that
was no name or a missing repository made every episode `aborted` (left out of the baseline as
infrastructure); a test patch of null made every reward raise; a base_commit starting with '-'
went to `git archive` as an option; env.tasks.limit=-1 left out the last instance."""

from __future__ import annotations

import json

import pytest

from agentrl.env_config import EnvConfig
from agentrl.envs.swe import SweEnv
from agentrl.envs.swe_tasks import SHIPPED
from agentrl.types import ConfigError

GOOD = json.loads((SHIPPED / "tasks.jsonl").read_text().splitlines()[0])


def _load(**tasks):
    return EnvConfig(_target_="x", tasks=tasks).load_tasks(SweEnv)


def _file(tmp_path, *lines: str, prefix: str = "") -> str:
    path = tmp_path / "mine.jsonl"
    path.write_text(prefix + "".join(line + "\n" for line in lines))
    return str(path)


def _with(**fields) -> str:
    return json.dumps({**GOOD, **fields})


@pytest.mark.parametrize(
    ("line", "said"),
    [("[1, 2]", r"line 1: a JSON array, not an object"),
     ("{oops", r"line 1: not JSON \(Expecting property name"),
     (_with(FAIL_TO_PASS=[]), r"FAIL_TO_PASS is empty: .*every episode scores 0"),
     (_with(FAIL_TO_PASS=5), r"FAIL_TO_PASS is 5; give a list of test ids, 'path::test'"),
     (_with(FAIL_TO_PASS=[1]), r"FAIL_TO_PASS is \[1\]; give a list of test ids"),
     (_with(PASS_TO_PASS="[not json"), r"PASS_TO_PASS is the text '\[not json', not a JSON list"),
     (_with(problem_statement=5), r"problem_statement is 5; give it as non-empty text"),
     (_with(problem_statement=" "), r"problem_statement is ' '; give it as non-empty text"),
     (_with(instance_id=7), r"instance 7: instance_id is 7; give it as non-empty text"),
     (_with(test_patch=None), r"test_patch is None; give the diff as text"),
     (_with(image=5), r"image is 5; the name of one of the sandbox service's images, or null"),
     (_with(base_commit="--output=/tmp/x"), r"base_commit '--output=/tmp/x' / repo 'convkit': "
      r"a commit's hash"),
     (_with(repo="nosuch"), r"repository 'nosuch': neither .*nosuch\.bundle nor a git checkout "
      r"at .*; put one there, or set env\.tasks\.repos")],
)  # fmt: skip
def test_a_wrong_instance_is_refused_with_its_line(tmp_path, line, said):
    with pytest.raises(ConfigError, match=r"env\.tasks: SweEnv\.load_tasks: .*" + said):
        _load(path=_file(tmp_path, json.dumps(GOOD | {"instance_id": "first"}), line)
              if line.startswith("{") and not line.startswith("{oops")
              else _file(tmp_path, line))  # fmt: skip


def test_a_bom_and_swe_benchs_json_string_test_ids_load(tmp_path):
    row = _with(FAIL_TO_PASS=json.dumps(GOOD["FAIL_TO_PASS"]))
    (task,) = _load(path=_file(tmp_path, row, prefix="\ufeff"))
    assert task.data["FAIL_TO_PASS"] == GOOD["FAIL_TO_PASS"]


def test_a_limit_below_one_is_refused():
    with pytest.raises(ConfigError, match=r"limit=-1: give 1 or more"):
        _load(limit=-1)
    assert len(_load(limit=2)) == 2 and len(_load()) == 64
