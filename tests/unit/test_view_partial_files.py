"""`agentrl view` on the files of a run that is still writing them, or was killed mid-line."""

import json

from agentrl.cli.view import main
from agentrl.trajectory_view import load_jsonl, steps_in
from agentrl.types import FinishReason, Message, StopReason, Trajectory, Turn


def _traj(tok, task: str) -> Trajectory:
    p, a = tok.encode("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"), tok.encode("yo")
    ids = p + a
    mask = [0] * len(p) + [1] * len(a)
    turn = Turn(len(p), len(ids), len(ids), "0", FinishReason.STOP,
                Message(role="assistant", content="yo"), text="yo")  # fmt: skip
    return Trajectory(task, 0, ids, mask, [-0.5 * m for m in mask], len(p), [turn],
                      [Message(role="user", content="hi")], StopReason.COMPLETED, reward=1.0)  # fmt: skip


def test_view_reads_a_file_whose_last_line_is_being_written(tmp_path, qwen_tokenizer,
                                                            qwen_tokenizer_dir):  # fmt: skip
    lines = [json.dumps({"step": s, **_traj(qwen_tokenizer, f"t{s}").to_dict()}) for s in (1, 2)]
    torn = json.dumps({"step": 3, **_traj(qwen_tokenizer, "t3").to_dict()})[:150]
    path = tmp_path / "trajectories.jsonl"
    path.write_text(lines[0] + "\n" + lines[1] + "\n" + torn)  # training is writing step 3
    assert steps_in(path) == [1, 2]
    ((step, traj, _),) = load_jsonl(path)  # the last whole step
    assert (step, traj.task_id) == (2, "t2")
    main([str(tmp_path), "--tokenizer", str(qwen_tokenizer_dir)])
    assert "t2 #0" in (tmp_path / "view_2.html").read_text()


def test_a_whole_last_line_without_its_newline_is_still_read(tmp_path, qwen_tokenizer):
    path = tmp_path / "trajectories.jsonl"  # written by hand, no newline at the end
    path.write_text(json.dumps({"step": 4, **_traj(qwen_tokenizer, "t4").to_dict()}))
    assert steps_in(path) == [4] and load_jsonl(path)[0][1].task_id == "t4"


def test_view_says_how_many_of_the_steps_trajectories_it_drew(tmp_path, qwen_tokenizer,
                                                              qwen_tokenizer_dir, capsys):  # fmt: skip
    lines = [json.dumps({"step": 1, **_traj(qwen_tokenizer, f"t{i}").to_dict()}) for i in range(6)]
    (tmp_path / "trajectories.jsonl").write_text("\n".join(lines) + "\n")
    main([str(tmp_path), "--tokenizer", str(qwen_tokenizer_dir)])
    assert "(4 of the 6 trajectories of step 1; -n 6 draws them all)" in capsys.readouterr().out
    main([str(tmp_path), "--tokenizer", str(qwen_tokenizer_dir), "-n", "6"])
    assert "(6 of the 6 trajectories of step 1)" in capsys.readouterr().out
