"""bench/pyspy_summary.py: py-spy's raw stacks of a process tree, attributed per process to the
loop they ran under, with the start-up outside the loop left out."""

from __future__ import annotations

import importlib.util
import lzma
from pathlib import Path

_SPEC = importlib.util.spec_from_file_location(
    "pyspy_summary", Path(__file__).resolve().parents[2] / "bench" / "pyspy_summary.py"
)
pyspy_summary = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(pyspy_summary)

RAW = """\
process 10:"python -m sglang.launch_server";_find_and_load (<frozen importlib>:1) 500
process 10:"python -m sglang.launch_server";Runner.run (asyncio/runners.py:118);generate_request (sglang/http_server.py:3);convert (tm.py:9) 30
process 10:"python -m sglang.launch_server";Runner.run (asyncio/runners.py:118);generate_request (sglang/http_server.py:3) 10
process 10:"";process 11:"spawn";Scheduler.event_loop_overlap (scheduler.py:1);run_batch (scheduler.py:5) 60
process 10:"";process 11:"spawn";Scheduler.event_loop_overlap (scheduler.py:1);get_loads (load_inquirer.py:91) 20
not a stack line
"""


def test_each_process_counts_only_its_loop_and_per_request(tmp_path, capsys):
    raw = tmp_path / "server.txt.xz"
    with lzma.open(raw, "wt") as f:
        f.write(RAW)
    stacks = pyspy_summary.read_stacks(raw)
    assert len(stacks) == 5  # the malformed line is skipped
    http = pyspy_summary.under(stacks, "Runner.run")
    assert list(http) == ["process 10"]  # start-up imports are not under the loop
    total, inc, own = http["process 10"]
    assert total == 40 and inc["generate_request (http_server.py)"] == 40
    assert own == {"convert (tm.py)": 30, "generate_request (http_server.py)": 10}
    sched = pyspy_summary.under(stacks, "Scheduler.event_loop_overlap")
    assert list(sched) == ["process 11"] and sched["process 11"][0] == 80  # the child's own
    pyspy_summary.report(stacks, ("Runner.run",), rate=200, requests=10, top=5)
    out = capsys.readouterr().out
    assert "process 10 under Runner.run: 0.20 s, 20.000 ms a request" in out
