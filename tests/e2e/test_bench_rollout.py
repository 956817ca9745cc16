"""bench/rollout_throughput.py runs every side it measures (reference, rollout, coalesced rollout,
rollout with tool latency, bare client) against a dev server and writes its figures: the GPU
measurements of issue 43 use exactly these paths, and a bench that crashes there costs device
time."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_rollout_bench_measures_every_side(scratch_devserver, tiny_model_dir, tmp_path):
    out = tmp_path / "figures.json"
    cmd = [sys.executable, str(ROOT / "bench" / "rollout_throughput.py"), "--url", scratch_devserver,
           "--model", str(tiny_model_dir), "--mode", "both", "--episodes", "3", "--turns", "2",
           "--new-tokens", "4", "--prompt-tokens", "32", "--batch-window-ms", "2",
           "--coalesce", "5:20:1,2:50:256",
           "--tool-latency-ms", "5", "--json", str(out)]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    single, multi = json.loads(out.read_text())["results"]
    for r in (single, multi):
        assert r["tokens"] == 3 * 4 and r["ratio"] > 0
        assert set(r["coalesced"]) == {"2:50:16", "5:20:1", "2:50:256"}, r["coalesced"]
        assert all(c["s"] > 0 and c["turns_per_request"] >= 1 for c in r["coalesced"].values())
    assert multi["turns"] == 2 and multi["bare_turns_s"] > 0 and multi["tool_latency_s"] > 0
    assert "tool latency" in done.stdout and "bare multi-turn client" in done.stdout
    assert "client fast paths (transformers" in done.stdout and "template on" in done.stdout
    assert done.stdout.count("rollout coalesced (window") == 6, done.stdout


def test_turn_boundary_bench_runs_its_three_clients():
    """bench/rollout_overhead.py --lockstep-ms: per-episode requests, coalesced batches answered
    in chunks and answered at once, against a server answering each turn after a fixed delay."""
    cmd = [sys.executable, str(ROOT / "bench" / "rollout_overhead.py"), "--lockstep-ms", "40",
           "--episodes", "16", "--turns", "2", "--rounds", "1", "--new-tokens", "8"]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    rows = [x for x in done.stdout.splitlines() if "ideal/wall" in x]
    assert len(rows) == 3 and rows[0].startswith("per-episode requests")
    ratios = [float(x.split("ideal/wall")[1].split()[0]) for x in rows]
    assert all(0 < r <= 1.05 for r in ratios), rows


def test_client_overhead_bench_runs_with_groups_and_a_frozen_collector():
    """bench/rollout_overhead.py --http --group-size --gc-freeze: the figures of the client's CPU
    per request in docs/benchmarks.md come from this path."""
    cmd = [sys.executable, str(ROOT / "bench" / "rollout_overhead.py"), "--http", "--episodes",
           "16", "--turns", "2", "--rounds", "2", "--group-size", "4", "--gc-freeze"]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    rows = [x for x in done.stdout.splitlines() if "ms/request (median of 2 rounds" in x]
    assert [x.split()[0] for x in rows] == ["agentrl", "bare", "bare"], done.stdout
