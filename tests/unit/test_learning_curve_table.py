"""bench/learning_curve.py's table: a column per reward component the run logged, none for an env
whose reward is a number (a new user's run printed a `reward/correct` column of nan)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

_SPEC = importlib.util.spec_from_file_location(
    "learning_curve", Path(__file__).resolve().parents[2] / "bench" / "learning_curve.py"
)
learning_curve = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(learning_curve)


def _row(step: int, **extra: float) -> dict[str, float]:
    base = {"step": step, "reward/mean": 0.5, "reward/max": 1.0, "reward/min": 0.0}
    return (
        base | {"reward/std": 0.5, "rollout/tool_call_rate": 0.25, "timing_s/rollout": 2.0} | extra
    )


def test_a_number_reward_has_no_component_columns():
    text = learning_curve.table([_row(1), _row(2)])
    assert text.splitlines()[0] == "| step | elapsed s | reward/mean | tool_call_rate | step s |"
    assert text.splitlines()[3] == "| 2 | 4 | 0.500 | 0.25 | 2.0 |"
    assert "nan" not in text


def test_each_component_of_a_dict_reward_is_a_column():
    rows = [_row(1, **{"reward/correct": 0.25, "reward/used_tool": 1.0, "reward/mean_all": 0.5})]
    lines = learning_curve.table(rows).splitlines()
    assert lines[0] == (
        "| step | elapsed s | reward/mean | reward/correct | reward/used_tool | tool_call_rate "
        "| step s |"
    )
    assert lines[1].count("---:") == 7
    assert lines[2] == "| 1 | 2 | 0.500 | 0.250 | 1.000 | 0.25 | 2.0 |"
