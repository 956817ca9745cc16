"""What the policy and its tools wrote, in W&B: every text of the turn table is cut to
`logging.wandb.max_text_chars` (the cut said), and a lone surrogate or NUL in it no longer turns
W&B off for the rest of the run. With real wandb offline (no network, no API key)."""

import json

import pytest
from wandb_rows import offline_rows

from agentrl.tracking import LoggingConfig, Tracker, WandbConfig
from agentrl.trajectory_view import TURN_COLUMNS, turn_rows
from agentrl.types import FinishReason, Message, StopReason, ToolCall, Trajectory, Turn

COL = {c: i for i, c in enumerate(TURN_COLUMNS)}
HUGE = 5_000_000


@pytest.fixture(autouse=True)
def _offline(monkeypatch):
    for k in ("WANDB_API_KEY", "WANDB_MODE", "WANDB_DISABLED", "WANDB_DIR", "WANDB_RUN_ID"):
        monkeypatch.delenv(k, raising=False)  # offline, whatever the machine has


def odd(tok, text: str) -> Trajectory:
    """A turn whose tool call, tool output, error and reference all carry `text`."""
    p = tok.encode("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")
    a, o = tok.encode("yo"), tok.encode("<|im_end|>\n<|im_start|>user\nout")
    ids = p + a + o
    mask = [0] * len(p) + [1] * len(a) + [0] * len(o)
    call = ToolCall(id="c0", name="python", arguments={"code": text})
    turn = Turn(len(p), len(p) + len(a), len(ids), "0", FinishReason.STOP,
                Message(role="assistant", content="yo", tool_calls=[call]), text="yo" + text,
                observations=[Message(role="tool", content=text, name="py\ud800")])  # fmt: skip
    return Trajectory("t1", 0, ids, mask, [-0.5 * m for m in mask], len(p), [turn],
                      [Message(role="user", content=text)], StopReason.COMPLETED, error=text,
                      metadata={"reference": text})  # fmt: skip


def test_every_text_of_the_turn_table_is_cut_and_the_cut_said(qwen_tokenizer):
    (row,) = turn_rows(1, [odd(qwen_tokenizer, "x" * HUGE)], max_chars=4000)
    texts = {c: row[COL[c]] for c in TURN_COLUMNS if isinstance(row[COL[c]], str)}
    assert max(map(len, texts.values())) < 4100  # tool_calls, error, reference were 5 MB
    for c in ("prompt", "assistant", "tool_calls", "tool_results", "error", "reference"):
        assert texts[c].endswith(" more chars]"), c


def test_a_lone_surrogate_or_nul_from_a_tool_keeps_wandb_logging(tmp_path, qwen_tokenizer):
    cfg = LoggingConfig(wandb=WandbConfig(enabled=True, mode="offline", system_metrics=False))
    tracker = Tracker(cfg, tmp_path, run_name="odd", tokenizer=qwen_tokenizer)
    tracker.log_step(1, {"step": 1.0}, [odd(qwen_tokenizer, "\x00\ud800" + "y" * HUGE)])
    tracker.log_step(2, {"step": 2.0}, [odd(qwen_tokenizer, "fine")])
    assert tracker.wandb in tracker.sinks  # was: "wandb logging failed at step 1 ... it is off"
    tracker.close()
    run = tracker.wandb.run_dir
    rows = offline_rows(run, 2)
    assert [r["step"] for r in rows] == [1, 2]
    files = [run / "files" / r[k]["path"] for r in rows for k in ("trajectories/turns",
                                                                  "trajectories/html")]  # fmt: skip
    assert all(f.stat().st_size < 200_000 for f in files)  # not the tool's 5 MB
    table = json.loads(files[0].read_text(encoding="utf-8"))
    results = table["data"][0][COL["tool_results"]]
    assert results.startswith("[py\ufffd] \x00\ufffdyyy") and results.endswith(" more chars]")
    page = files[1].read_text(encoding="utf-8")
    assert '<span class="cc">\\x00</span><span class="cc">\\ud800</span>' in page  # the error
