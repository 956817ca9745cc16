"""A file-size limit (`ulimit -f`, RLIMIT_FSIZE) in the user's shell: Ray's raylet was killed
creating its object store file, and `start_ray` said only, 30 s later, "could not start Ray ...
The current node timed out during startup" (and blamed memory, disk or stale processes). A soft
limit is now raised to the hard one (a warning says so) and Ray starts; a hard limit below the
store is one line naming the limit, its value and `ulimit -f unlimited`, before Ray starts.
Each case runs in a subprocess of its own: the limit of the pytest process is never changed."""

from __future__ import annotations

import json
import subprocess
import sys

SCRIPT = """
import json, resource, sys
soft, hard = (int(v) for v in sys.argv[1:3])
resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
import ray
from agentrl.learner import LearnerError, RayConfig
from agentrl.learner.ray_start import start_ray, stop_ray
out = {}
try:
    start_ray(RayConfig(num_cpus=1))
    out["started"] = ray.is_initialized()
except LearnerError as e:
    out["error"], out["started"] = str(e), ray.is_initialized()
out["limit"] = list(resource.getrlimit(resource.RLIMIT_FSIZE))
stop_ray()
print("RESULT " + json.dumps(out))
"""


def start_under(soft: int, hard: int) -> tuple[dict, str]:
    """start_ray in a fresh Python with RLIMIT_FSIZE (soft, hard): what it said, and stderr."""
    p = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(soft), str(hard)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    line = next((ln for ln in p.stdout.splitlines() if ln.startswith("RESULT ")), None)
    assert line is not None, f"rc {p.returncode}\n{p.stdout}\n{p.stderr[-3000:]}"
    return json.loads(line.removeprefix("RESULT ")), p.stderr


def test_a_soft_file_size_limit_is_raised_and_ray_starts():
    out, stderr = start_under(1_000_000, -1)  # -1: RLIM_INFINITY
    assert out == {"started": True, "limit": [-1, -1]}, (out, stderr[-3000:])
    assert "file-size limit (ulimit -f, RLIMIT_FSIZE) from 1,000,000 bytes" in stderr
    assert "to its hard limit, unlimited" in stderr


def test_a_hard_file_size_limit_below_the_object_store_is_one_line_before_ray_starts():
    out, _ = start_under(1_000_000, 1_000_000)
    assert out["started"] is False and out["limit"] == [1_000_000, 1_000_000]
    error = out["error"]
    assert "\n" not in error
    assert "file-size limit (ulimit -f, RLIMIT_FSIZE) is 1,000,000 bytes" in error
    assert "object store is one file of 256 MB (ray.object_store_mb)" in error
    assert "run `ulimit -f unlimited`" in error
