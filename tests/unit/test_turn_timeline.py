"""bench/turn_timeline.py: an SGLang log with millisecond stamps and a client's turn times merge
into the four segments of each turn."""

from __future__ import annotations

import datetime as dt
import importlib.util
import sys
from pathlib import Path

import pytest

_SPEC = importlib.util.spec_from_file_location(
    "turn_timeline", Path(__file__).resolve().parents[2] / "bench" / "turn_timeline.py"
)
turn_timeline = importlib.util.module_from_spec(_SPEC)
sys.modules["turn_timeline"] = turn_timeline  # its dataclasses resolve their module
_SPEC.loader.exec_module(turn_timeline)

T0 = dt.datetime(2026, 11, 28, 15, 0, 0)


def stamp(s: float) -> str:
    return (T0 + dt.timedelta(seconds=s)).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]


def line(s: float, text: str) -> str:
    return f"[{stamp(s)} TP0] {text}"


LOG = "\n".join([
    line(0.0, "Load weight end."),
    line(1.10, "Prefill batch, #new-seq: 100, #new-token: 2400, #cached-token: 40000, "
         "token usage: 0.10, #running-req: 0, #queue-req: 156, cuda graph: False"),
    line(1.15, "Prefill batch, #new-seq: 156, #new-token: 3744, #cached-token: 62400, "
         "#running-req: 100, #queue-req: 0, cuda graph: False"),
    line(1.20, "Decode batch, #running-req: 100, #token: 1, cuda graph: True"),
    line(1.30, "Decode batch, #running-req: 256, #token: 1, cuda graph: True"),
    line(1.70, "Decode batch, #running-req: 256, #token: 1, cuda graph: True"),
    "a line of something else",
])  # fmt: skip


def test_the_log_lines_parse_with_their_counters():
    batches = turn_timeline.parse_log(LOG)
    assert [b.kind for b in batches] == ["prefill", "prefill", "decode", "decode", "decode"]
    assert batches[0].counts["new-seq"] == 100 and batches[1].counts["queue-req"] == 0
    assert batches[3].counts["running-req"] == 256
    assert batches[1].t - batches[0].t == pytest.approx(0.05, abs=1e-6)


def test_a_turn_splits_into_in_prefill_decode_out():
    batches = turn_timeline.parse_log(LOG)
    sent = (T0 + dt.timedelta(seconds=1.0)).timestamp()
    turn = turn_timeline.Turn(sent=sent, sent_last=sent + 0.02, answered_first=sent + 0.8,
                              answered=sent + 0.9)  # fmt: skip
    seg = turn_timeline.split_turn(turn, batches, episodes=256)
    assert seg["in"] == pytest.approx(0.10, abs=1e-3)
    assert seg["prefill"] == pytest.approx(0.20, abs=1e-3)  # to the first decode of all 256
    assert seg["decode"] == pytest.approx(0.40, abs=1e-3)
    assert seg["out"] == pytest.approx(0.20, abs=1e-3)
    assert seg["prefill_batches"] == 2 and seg["new_seq_first"] == 100
    assert seg["send_spread"] == pytest.approx(0.02, abs=1e-6)
    assert seg["answer_spread"] == pytest.approx(0.1, abs=1e-6)


def test_a_turn_without_prefill_lines_is_none_and_a_log_without_stamps_is_refused():
    batches = turn_timeline.parse_log(LOG)
    late = (T0 + dt.timedelta(seconds=5)).timestamp()
    assert (
        turn_timeline.split_turn(turn_timeline.Turn(late, late, late, late + 1), batches, 4) is None
    )
    with pytest.raises(SystemExit, match="SGLANG_LOG_MS"):
        turn_timeline.parse_log("[2026-11-28 15:00:00 TP0] Prefill batch, #new-seq: 1")
