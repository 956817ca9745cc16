"""`agentrl view` on files a run left damaged or odd (garbage lines, bytes that are not UTF-8,
huge tool output, NUL, lone surrogates, a step without trajectories): it draws what it can and
says what it skipped, never a traceback; the JSONL sink writes such trajectories whole."""

import json

import pytest

from agentrl.cli.view import main
from agentrl.tracking import LoggingConfig, Tracker, WandbConfig
from agentrl.trajectory_view import load_jsonl, render_html, steps_in
from agentrl.types import FinishReason, Message, StopReason, Trajectory, Turn


def traj(tok, task: str, tool_output: str = "4") -> Trajectory:
    p = tok.encode("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")
    a, o = tok.encode("yo"), tok.encode("<|im_end|>\n<|im_start|>user\nout")
    ids = p + a + o
    mask = [0] * len(p) + [1] * len(a) + [0] * len(o)
    obs = [Message(role="tool", content=tool_output, name="python")]
    turn = Turn(len(p), len(p) + len(a), len(ids), "0", FinishReason.STOP,
                Message(role="assistant", content="yo"), text="yo", observations=obs)  # fmt: skip
    return Trajectory(task, 0, ids, mask, [-0.5 * m for m in mask], len(p), [turn],
                      [Message(role="user", content="hi")], StopReason.COMPLETED)  # fmt: skip


def line(tok, task: str, step: int = 1) -> str:
    return json.dumps({"step": step, **traj(tok, task).to_dict()})


def test_lines_that_are_not_trajectories_are_skipped_and_said(tmp_path, qwen_tokenizer,
                                                              qwen_tokenizer_dir, capsys):  # fmt: skip
    good = line(qwen_tokenizer, "t1")
    odd = line(qwen_tokenizer, "t\u00e9").replace("t\\u00e9", "t\xe9")  # Latin-1, not UTF-8
    body = "\n".join([good, "{garbage", "[1, 2]", '{"step": 1, "task_id": "x"}',
                      '{"step": "one"}', "", line(qwen_tokenizer, "t2")]) + "\n"  # fmt: skip
    path = tmp_path / "trajectories.jsonl"
    path.write_bytes(body.encode() + odd.encode("latin-1") + b"\n" + good[:90].encode())
    skipped: list[str] = []
    items = load_jsonl(path, 1, skipped)
    assert [t.task_id for _, t, _ in items] == ["t1", "t2", "t\ufffd"]
    assert skipped[0].startswith("line 2: skipped, not JSON")
    assert skipped[1:3] == ["line 3: skipped, a JSON list, not a trajectory",
                            "line 5: skipped, its step 'one' is not a number"]  # fmt: skip
    assert skipped[3:5] == ["line 8: bytes that are not UTF-8, read as U+FFFD",
                            "line 9: skipped, cut short (the run is writing it, or was killed)"]  # fmt: skip
    assert skipped[5].startswith("line 4: skipped, not a trajectory (KeyError")
    main([str(tmp_path), "--tokenizer", str(qwen_tokenizer_dir), "-n", "9"])  # was: a traceback
    out = capsys.readouterr().out
    assert "trajectories.jsonl: 6 lines not read as they are:\n  line 2: skipped, not JSON" in out
    assert "(3 of the 3 trajectories of step 1)" in out


def test_line_separators_inside_a_line_do_not_split_it(tmp_path, qwen_tokenizer):
    odd = "a\u2028b\u2029c\x85d\x1ce\x0cf"  # str.splitlines() splits at each of these
    row = {"step": 2, **traj(qwen_tokenizer, "t1", tool_output=odd).to_dict()}
    path = tmp_path / "trajectories.jsonl"
    path.write_text(json.dumps(row, ensure_ascii=False) + "\n", encoding="utf-8")
    assert steps_in(path) == [2]  # was: ValueError, a line cut at U+2028
    ((_, t, _),) = load_jsonl(path)
    assert t.turns[0].observations[0].content == odd


def test_an_empty_file_or_a_step_without_trajectories_is_said(tmp_path, qwen_tokenizer):
    path = tmp_path / "trajectories.jsonl"
    path.write_text("")
    with pytest.raises(SystemExit, match="no trajectories for any step; it holds none"):
        main([str(tmp_path)])
    path.write_text(line(qwen_tokenizer, "t1", step=3) + "\n")
    with pytest.raises(SystemExit, match=r"no trajectories for step 2; it has steps \[3\]"):
        main([str(tmp_path), "--step", "2"])
    path.write_text('{"step": 1, "task_id": "x"}\n' + line(qwen_tokenizer, "t1", step=1)[:50])
    with pytest.raises(SystemExit) as e:
        main([str(tmp_path)])
    said = str(e.value)
    assert "2 lines not read as they are:\n  line 2: skipped, cut short" in said
    assert "\n  line 1: skipped, not a trajectory (KeyError" in said
    assert said.endswith("no trajectories for its last step, 1; it has steps [1]")


def test_huge_nul_and_surrogate_tool_output_is_written_whole_and_read_back(tmp_path,
                                                                           qwen_tokenizer):  # fmt: skip
    out = "\x00\ud800 " + "A" * 5_000_000  # a tool's 5 MB, with a NUL and a lone surrogate
    cfg = LoggingConfig(wandb=WandbConfig(enabled=False))
    tracker = Tracker(cfg, tmp_path)
    tracker.log_step(1, {"step": 1.0}, [traj(qwen_tokenizer, "t1", out)])
    tracker.log_step(2, {"step": 2.0}, [])  # a step without trajectories: nothing written
    tracker.close()
    assert steps_in(tmp_path / "trajectories.jsonl") == [1]
    ((_, t, _),) = load_jsonl(tmp_path / "trajectories.jsonl")
    assert t.turns[0].observations[0].content == out  # the record keeps every character
    render_html([(1, t, None)], qwen_tokenizer).encode("utf-8")
    empty = Trajectory("gw", 0, [], [], [], 0, [], [], StopReason.ABORTED, error="no requests")
    assert "no requests" in render_html([(0, empty, None)], qwen_tokenizer)  # nothing sampled
