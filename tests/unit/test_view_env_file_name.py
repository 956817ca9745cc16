"""`agentrl view RUN --env NAME` names its page after the env: `view_<step>.html` for both envs of
a mixture's step meant the second view overwrote the first."""

import json

from agentrl.cli.view import main
from agentrl.types import FinishReason, Message, StopReason, Trajectory, Turn


def _traj(tok, task: str, env: str) -> Trajectory:
    p, a = tok.encode("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"), tok.encode("yo")
    ids, mask = p + a, [0] * len(p) + [1] * len(a)
    turn = Turn(len(p), len(ids), len(ids), "0", FinishReason.STOP,
                Message(role="assistant", content="yo"), text="yo")  # fmt: skip
    return Trajectory(task, 0, ids, mask, [-0.5 * m for m in mask], len(p), [turn],
                      [Message(role="user", content="hi")], StopReason.COMPLETED, reward=1.0,
                      metadata={"env": env})  # fmt: skip


def test_views_of_two_envs_at_one_step_are_two_files(tmp_path, qwen_tokenizer,
                                                     qwen_tokenizer_dir, capsys):  # fmt: skip
    trajs = [_traj(qwen_tokenizer, "code/t1", "code"), _traj(qwen_tokenizer, "units/t2", "units")]
    lines = [json.dumps({"step": 3, **t.to_dict()}) for t in trajs]
    (tmp_path / "trajectories.jsonl").write_text("\n".join(lines) + "\n")
    for env in ("code", "units"):
        main([str(tmp_path), "--env", env, "--tokenizer", str(qwen_tokenizer_dir)])
    printed = capsys.readouterr().out
    code, units = tmp_path / "view_code_3.html", tmp_path / "view_units_3.html"
    assert f"wrote {code} " in printed and f"wrote {units} " in printed
    assert "code/t1" in code.read_text() and "units/t2" not in code.read_text()
    assert "units/t2" in units.read_text() and "code/t1" not in units.read_text()
    main([str(tmp_path), "--tokenizer", str(qwen_tokenizer_dir)])  # no --env: as before
    assert f"wrote {tmp_path / 'view_3.html'} " in capsys.readouterr().out
