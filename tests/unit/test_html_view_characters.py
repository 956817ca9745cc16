"""The HTML trajectory view shows what the model sampled, character for character."""

import re

from agentrl.trajectory_view import render_html
from agentrl.types import FinishReason, Message, StopReason, Trajectory, Turn


def test_a_character_sampled_as_several_byte_tokens_is_shown_whole(qwen_tokenizer):
    tok = qwen_tokenizer
    p, a = (
        tok.encode("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"),
        tok.encode("ok 🎉!"),
    )
    assert len(a) > len(tok.encode("ok !"))  # 🎉 is more than one token (its UTF-8 bytes)
    ids = p + a
    mask = [0] * len(p) + [1] * len(a)
    turn = Turn(len(p), len(ids), len(ids), "0", FinishReason.STOP,
                Message(role="assistant", content="ok 🎉!"), text="ok 🎉!")  # fmt: skip
    t = Trajectory("t1", 0, ids, mask, [-0.25 * m for m in mask], len(p), [turn],
                   [Message(role="user", content="hi")], StopReason.COMPLETED)  # fmt: skip
    lps = [-0.5 * m for m in mask]
    page = render_html([(1, t, lps)], tok)
    boxes = re.findall(r'<span class="t" style="[^"]*" title="([^"]*)">([^<]*)</span>', page)
    assert "".join(text for _, text in boxes) == "ok 🎉!"  # not "ok ���!"
    tips = "".join(tip for tip, _ in boxes)
    assert all(f"#{i} id={ids[i]}" in tips for i in range(len(p), len(ids)))  # every token
    assert tips.count("rollout=-0.2500") == len(a) and tips.count("trainer=-0.5000") == len(a)
