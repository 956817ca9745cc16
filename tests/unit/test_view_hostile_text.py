"""The HTML trajectory view (`agentrl view`, W&B's trajectories/html) shows what the policy and
its tools wrote as text only: no markup, script, link or event handler of theirs reaches the page,
and characters a page would hide or a file cannot encode are written out."""

import os
import re
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path

from agentrl.trajectory_view import render_html
from agentrl.types import FinishReason, Message, StopReason, Trajectory, Turn

EVIL = (
    "</script><script>alert(1)</script><img src=x onerror=alert(2)>\"' onmouseover=alert(3) x='"
    '</textarea></title><a href="javascript:alert(4)">go</a><!-- \u2028\u2029 &amp;'
)
# what the page may hold: the view's own tags and attributes, nothing a text could add
TAGS = {"html", "head", "meta", "title", "style", "body", "input", "label", "div", "span", "h3",
        "details", "summary", "br"}  # fmt: skip
ATTRS = {"charset", "type", "name", "id", "checked", "for", "class", "style", "title"}


class Page(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.tags: list[tuple[str, list[tuple[str, str | None]]]] = []
        self.text: list[str] = []

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, attrs))

    def handle_data(self, data):
        self.text.append(data)


def hostile(tok, text: str = EVIL, **kw) -> Trajectory:
    p = tok.encode(f"<|im_start|>user\n{text}<|im_end|>\n<|im_start|>assistant\n")
    a = tok.encode(text)
    o = tok.encode(f"<|im_end|>\n<|im_start|>user\n<tool_response>\n{text}\n</tool_response>")
    ids = p + a + o
    mask = [0] * len(p) + [1] * len(a) + [0] * len(o)
    turn = Turn(len(p), len(p) + len(a), len(ids), "0", FinishReason.STOP,
                Message(role="assistant", content=text), text=text)  # fmt: skip
    return Trajectory(text, 0, ids, mask, [-0.5 * m for m in mask], len(p), [turn],
                      [Message(role="user", content=text)], StopReason.COMPLETED, **kw)  # fmt: skip


def test_text_of_the_policy_anywhere_on_the_page_stays_text(qwen_tokenizer):
    traj = hostile(qwen_tokenizer, reward_components={EVIL: 1.0}, error=EVIL,
                   metadata={"reference": EVIL, "sequence": EVIL, "rewrite": [EVIL, EVIL]})  # fmt: skip
    page = render_html([(1, traj, None)], qwen_tokenizer, title=EVIL, kind=EVIL)
    parsed = Page()
    parsed.feed(page)
    assert {tag for tag, _ in parsed.tags} <= TAGS  # no <script>, <img>, <a>, <textarea> added
    attrs = [(k, v or "") for _, kv in parsed.tags for k, v in kv]
    assert {k for k, _ in attrs} <= ATTRS  # no onerror=, onmouseover=, href=, src=
    assert all("javascript" not in v for k, v in attrs if k != "title")  # title: shown as text
    styles = {v for k, v in attrs if k == "style"}
    assert all(re.fullmatch(r"(--d|background):#[0-9a-f]{6}", v) for v in styles), styles
    text = "".join(parsed.text)
    assert text.count(EVIL) >= 6  # prompt, answer, tool output, task id, error, title: as written
    assert "</script><script>" not in page and "<img" not in page and "</textarea>" not in page
    assert "&lt;/script&gt;&lt;script&gt;alert(1)" in page and "&quot;&#x27;" in page
    assert "sequence &lt;/script&gt;" in page  # the header's every part, metadata too


def test_control_characters_and_lone_surrogates_are_written_out_and_the_page_encodes(
    qwen_tokenizer,
):
    odd = "a\x00b\x1b[31mc\x7fd"  # NUL, ESC, DEL: sampled, in the prompt and the tool output
    traj = hostile(qwen_tokenizer, odd, error="tool said \ud800\x00")  # a lone surrogate
    page = render_html([(1, traj, None)], qwen_tokenizer)
    page.encode("utf-8")  # raised UnicodeEncodeError: the view, and W&B's copy, were lost
    assert not any(c in page for c in "\x00\x1b\x7f\ud800")
    assert '<span class="cc">\\x00</span>' in page and '<span class="cc">\\x1b</span>' in page
    assert 'tool said <span class="cc">\\ud800</span><span class="cc">\\x00</span>' in page


def test_a_huge_error_or_task_id_is_cut_and_the_cut_said(qwen_tokenizer):
    traj = hostile(qwen_tokenizer, "hi", error="E" * 5_000_000)
    traj.task_id = "T" * 100_000
    page = render_html([(1, traj, None)], qwen_tokenizer)
    assert len(page) < 100_000
    assert f"{'E' * 4000} … [{5_000_000 - 4000} more chars]" in page
    assert f"{'T' * 200} … [{100_000 - 200} more chars]" in page


def test_agentrl_view_writes_utf8_whatever_the_locale(tmp_path, qwen_tokenizer,
                                                      qwen_tokenizer_dir):  # fmt: skip
    traj = hostile(qwen_tokenizer, "héllo · 🎉 \u2028", error="\ud800")
    (tmp_path / "trajectories.jsonl").write_text(traj.to_json() + "\n")
    env = {**os.environ, "LC_ALL": "C", "LANG": "C", "PYTHONUTF8": "0", "PYTHONCOERCECLOCALE": "0",
           "PYTHONPATH": os.pathsep.join(sys.path)}  # fmt: skip
    cmd = [sys.executable, "-m", "agentrl.cli.view", str(tmp_path), "--tokenizer",
           str(qwen_tokenizer_dir), "-o", str(tmp_path / "v.html")]  # fmt: skip
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]  # was UnicodeEncodeError: 'ascii' codec
    page = Path(tmp_path / "v.html").read_bytes().decode("utf-8")
    assert "héllo · 🎉" in page and '<span class="cc">\\ud800</span>' in page
