"""The GPU suite says before it starts whether it fits a device call: `pytest -m gpu tests/gpu
-n N --gpu-budget-s S` prints its estimate (each test's measured seconds, longest first over N
workers) and, over S, stops with exit status 3 and runs nothing. Here on CPU, where every GPU
test would be a skip: the plan is made all the same."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _suite(*args: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "pytest", "-m", "gpu", "tests/gpu", "-n", "2", "--dist",
           "loadgroup", "-q", "-p", "no:cacheprovider", *args]  # fmt: skip
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)


def test_a_gpu_suite_over_its_budget_is_refused_before_any_test_runs():
    out = _suite("--gpu-budget-s", "30")
    text = out.stdout + out.stderr
    assert out.returncode == 3, text[-2000:]
    assert "over --gpu-budget-s 30: not started" in text
    assert "on 2 workers" in text
    assert " passed" not in text and " skipped" not in text
