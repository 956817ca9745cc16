"""Trajectory views for people: one table row per turn, and an HTML page of whole trajectories.

`turn_rows` gives the rows of the W&B turn table (columns `TURN_COLUMNS`); `render_html` draws a
few trajectories token by token: the prompt and tool observations (loss mask 0) as grey/amber text,
each sampled token (loss mask 1) as its own box, coloured either by the loss mask or by the
|rollout - trainer| logprob gap (a switch at the top; hover a token for its id and logprobs).
Text that spells a special token (a tool that printed `<|im_end|>`) is shown escaped and struck
through with a dotted line, so it is never mistaken for the template's own special tokens.
Every text on the page (the policy's, its tools', task ids, reward names, errors) is escaped; the
page has no script and no link; control characters and lone surrogates are written out (`\\x00`).

The command line for runs without W&B is agentrl/cli/view.py:

    agentrl view runs/code_exec --step 5 -n 4 -o view.html
"""

from __future__ import annotations

import html
import json
import math
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from statistics import fmean
from typing import Any

from agentrl.types import FinishReason, Message, Trajectory, Turn

TURN_COLUMNS = [
    "step", "task", "sample", "sequence", "turn", "prompt", "assistant", "tool_calls", "tool_results",
    "reward", "turn_reward", "stop_reason", "finish_reason", "context_tokens", "sampled_tokens",
    "obs_tokens", "tool_errors", "parse_errors", "logprob_diff", "tool_latency_s",
    "gen_latency_s", "weight_version", "error", "reward_components", "reference",
]  # fmt: skip


def scoring(traj: Trajectory) -> str:
    """How the episode was scored, for people: the reward's components and the task's reference
    answer (from `Task.data`), when there are any."""
    parts = []
    if traj.reward_components:
        parts.append(", ".join(f"{k}={v:g}" for k, v in traj.reward_components.items()))
    if traj.metadata.get("reference") is not None:
        parts.append(f"reference {traj.metadata['reference']!r}")
    return " · ".join(parts)


Logprobs = Mapping[int, Sequence[float]]


def _clip(text: str, n: int) -> str:
    return text if len(text) <= n else text[:n] + f" … [{len(text) - n} more chars]"


# A lone surrogate (a tool call's JSON `"\\ud800"` decodes to one) cannot be encoded as UTF-8:
# W&B, a file or a terminal would raise on it. Control characters a page would hide or a browser
# drop (NUL) are shown written out too.
_SURROGATE = re.compile("[\ud800-\udfff]")
_HIDDEN = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\ud800-\udfff]")


def _plain(text: str) -> str:
    """`text` that encodes as UTF-8: each lone surrogate replaced by U+FFFD."""
    return _SURROGATE.sub("\ufffd", text)


def _cell(value: Any, max_chars: int) -> Any:
    """A W&B table cell: text clipped to `max_chars` (the cut said) and UTF-8-encodable."""
    return _plain(_clip(value, max_chars)) if isinstance(value, str) else value


def written_out(c: str) -> str:
    """The character `c` as its escape (`\\x00`, `\\ud800`): how the page and the console show
    what they must not print."""
    return f"\\x{ord(c):02x}" if ord(c) < 0x100 else f"\\u{ord(c):04x}"


def _esc(text: str, attr: bool = False) -> str:
    """`text` as HTML text (or, `attr`, a quoted attribute value): markup escaped, and each
    control character or lone surrogate written out (`\\x00`, `\\ud800`), marked in text."""
    out = html.escape(text, quote=True)
    if attr:
        return _HIDDEN.sub(lambda m: written_out(m.group()), out)
    return _HIDDEN.sub(lambda m: f'<span class="cc">{written_out(m.group())}</span>', out)


def _floats(x: Sequence[float]) -> list[float]:
    return x.tolist() if hasattr(x, "tolist") else list(x)  # a torch tensor or a list


def turn_gaps(traj: Trajectory, trainer_lps: Sequence[float] | None) -> list[float | None]:
    """Per turn: mean |rollout - trainer| logprob over its sampled tokens (None if unknown)."""
    if trainer_lps is None:
        return [None] * len(traj.turns)
    ours = _floats(trainer_lps)
    out: list[float | None] = []
    for t in traj.turns:
        gaps = [abs(ours[i] - traj.logprobs[i]) for i in range(t.start, t.end)]
        out.append(fmean(gaps) if gaps else None)
    return out


def _rewrite(tr: Trajectory) -> str:
    """What a context rewrite that began this sequence did ("" for none): the turn table's
    first row of the sequence and the HTML view's header say it."""
    rewrite = tr.metadata.get("rewrite")
    return f"(history rewritten: {rewrite[0]} → {rewrite[1]} tokens)" if rewrite else ""


def turn_rows(
    step: int,
    trajs: Sequence[Trajectory],
    trainer_logprobs: Logprobs | None = None,
    max_chars: int = 4000,
) -> list[list[Any]]:
    """One row per assistant turn (a trajectory without any turn still gets one row), in the
    order of `TURN_COLUMNS`; every text clipped to `max_chars` (the cut said) and UTF-8-safe."""
    rows = []
    for i, tr in enumerate(trajs):
        gaps = turn_gaps(tr, (trainer_logprobs or {}).get(i))
        user = next((m.content for m in tr.messages if m.role == "user"), "")
        turns: list[Turn | None] = list(tr.turns) or [None]
        for k, t in enumerate(turns):
            row = {
                "step": step,
                "task": tr.task_id,
                "sample": tr.sample_index,
                # one of an episode's sequences (a context rewrite, thinking=template, a fork)
                "sequence": int(tr.metadata.get("sequence") or 0),
                "turn": k,
                "prompt": " ".join(filter(None, [_rewrite(tr), _clip(user, max_chars)]))
                if k == 0
                else "",
                "reward": float(tr.reward),
                "stop_reason": tr.stop_reason.value,
                "error": (tr.error or "") if k == len(turns) - 1 else "",
                "reward_components": json.dumps(tr.reward_components) if k == 0 else "",
                "reference": str(tr.metadata.get("reference", "")) if k == 0 else "",
                **_turn_fields(t, gaps[k] if t else None, len(tr.token_ids), max_chars),
            }
            rows.append([_cell(row[c], max_chars) for c in TURN_COLUMNS])
    return rows


def _turn_fields(t: Turn | None, gap: float | None, n: int, max_chars: int) -> dict[str, Any]:
    if t is None:  # the episode ended before its first turn
        t = Turn(n, n, n, "", FinishReason.ABORT, Message(role="assistant"))
        finish = ""
    else:
        finish = t.finish_reason.value
    calls = [{"name": c.name, "arguments": c.arguments} for c in t.assistant.tool_calls]
    results = "\n---\n".join(f"[{m.name or m.role}] {m.content}" for m in t.observations)
    return {
        "assistant": _clip(t.text, max_chars),
        "tool_calls": json.dumps(calls) if calls else "",
        "tool_results": _clip(results, max_chars),
        "turn_reward": None if t.reward is None else float(t.reward),
        "finish_reason": finish,
        "context_tokens": t.start,
        "sampled_tokens": t.end - t.start,
        "obs_tokens": t.obs_end - t.end,
        "tool_errors": t.num_tool_errors,
        "parse_errors": t.num_parse_errors,
        "logprob_diff": gap,
        "tool_latency_s": float(t.tool_latency_s),
        "gen_latency_s": float(t.gen_latency_s),
        "weight_version": t.weight_version,
    }


def pick(trajs: Sequence[Trajectory], trainer_logprobs: Logprobs | None, n: int) -> list[int]:
    """Up to n trajectory indices worth reading: best and worst reward, most tool calls made
    (failed ones too), largest logprob gap, then the rest in order."""
    if n <= 0 or not trajs:
        return []
    idx = range(len(trajs))
    gap = {
        i: max((g for g in turn_gaps(trajs[i], lp) if g is not None), default=0.0)
        for i, lp in (trainer_logprobs or {}).items()
    }
    order = [
        max(idx, key=lambda i: trajs[i].reward),
        min(idx, key=lambda i: trajs[i].reward),
        max(idx, key=lambda i: trajs[i].num_tool_attempts),
        max(gap, key=gap.__getitem__) if gap else 0,
        *idx,
    ]
    return list(dict.fromkeys(order))[:n]


# -- HTML ---------------------------------------------------------------------------------------
_CSS = """
body{font:13px/1.45 ui-monospace,Menlo,Consolas,monospace;margin:8px;color:#222}
label{margin-right:14px;cursor:pointer} .legend{color:#555;margin:4px 0 10px}
.sw{display:inline-block;width:12px;height:12px;vertical-align:middle;border:1px solid #999}
.tr{border:1px solid #ccd;border-radius:4px;margin:10px 0;padding:6px 8px}
.tr h3{font-size:13px;margin:0 0 6px} .body{white-space:pre-wrap;word-break:break-word}
.p{background:#eceef2;color:#666} .o{background:#fff1cc;color:#6b5500}
.b{display:inline-block;font-size:11px;color:#fff;background:#557;border-radius:3px;padding:0 4px;
margin:2px 2px 2px 0;white-space:nowrap} .b.o2{background:#a67c00} .el{color:#999;font-style:italic}
.t{border-right:1px solid rgba(0,0,0,.12)}
#vm:checked ~ .trajs .t{background:#cfe0ff} #vd:checked ~ .trajs .t{background:var(--d)}
details.pd{display:inline} details.pd summary{display:inline;cursor:pointer;color:#557}
.lit{text-decoration:line-through dotted #c00;background:#fde2e2}
.cc{color:#c00;background:#fde2e2;border-radius:2px}
"""
_GAP_STOPS = ((0.0, (0xC8, 0xEC, 0xD0)), (0.5, (0xFF, 0xEE, 0x99)), (1.0, (0xF2, 0x9B, 0x9B)))


def gap_colour(gap: float | None) -> str:
    """|rollout - trainer| logprob → colour: ≤1e-3 green, 1e-2 yellow, ≥1e-1 red (log scale);
    None (no trainer logprob) grey."""
    if gap is None or math.isnan(gap):
        return "#dddddd"
    x = min(max((math.log10(max(gap, 1e-12)) + 3.0) / 2.0, 0.0), 1.0)
    for (x0, c0), (x1, c1) in zip(_GAP_STOPS, _GAP_STOPS[1:], strict=False):
        if x <= x1:
            f = (x - x0) / (x1 - x0)
            return "#" + "".join(
                f"{round(a + (b - a) * f):02x}" for a, b in zip(c0, c1, strict=True)
            )
    return "#f29b9b"


def _segment(tok: Any, ids: list[int], cls: str, label: str, budget: int) -> str:
    """A loss-mask-0 span (prompt or observation), its middle elided past `budget` tokens."""
    if not ids:
        return ""
    head, tail, hidden = ids, [], 0
    if len(ids) > budget:
        keep_head = min(64, budget // 4)
        head, tail = ids[:keep_head], ids[len(ids) - (budget - keep_head) :]
        hidden = len(ids) - len(head) - len(tail)
    text = _text_html(tok, head)
    if hidden:
        text += f'<span class="el"> … {hidden} tokens not shown … </span>'
        text += _text_html(tok, tail)
    return f'<span class="{cls}" title="{label}: {len(ids)} tokens, loss mask 0">{text}</span>'


def _text_html(tok: Any, ids: list[int]) -> str:
    """Escaped text of `ids`; where ordinary tokens spell a special token's text, that text is
    marked (class "lit"): it is text the model read as characters, not the special token."""
    added = getattr(tok, "added_tokens_decoder", None) or {}
    specials = sorted(
        (str(getattr(t, "content", t)) for t in added.values()), key=len, reverse=True
    )
    pattern = re.compile("|".join(map(re.escape, specials))) if specials else None
    out, run = [], []
    for i in [*ids, None]:  # runs of ordinary ids decode together; special ids one by one
        if i is not None and i not in added:
            run.append(i)
            continue
        text = tok.decode(run, skip_special_tokens=False) if run else ""
        pos = 0
        for m in pattern.finditer(text) if pattern else ():
            out.append(_esc(text[pos : m.start()]))
            out.append(f'<span class="lit" title="text, not a special token">'
                       f"{_esc(m.group())}</span>")  # fmt: skip
            pos = m.end()
        out.append(_esc(text[pos:]))
        run = []
        if i is not None:
            out.append(_esc(tok.decode([i], skip_special_tokens=False)))
    return "".join(out)


def _pieces(tok: Any, ids: list[int]) -> list[tuple[int, int, str]]:
    """(start, end, text) spans of `ids`, each decoding to whole characters: a token holding only
    some of a character's UTF-8 bytes (an emoji is often three) is joined with the next ones (up
    to 4 tokens), so the view shows the character the model wrote, not U+FFFD."""
    singles = tok.batch_decode([[i] for i in ids], skip_special_tokens=False)
    out, a = [], 0
    while a < len(ids):
        b, text = a + 1, singles[a]
        if "\ufffd" in text:
            for end in range(a + 2, min(a + 4, len(ids)) + 1):
                joined = tok.decode(ids[a:end], skip_special_tokens=False)
                if "\ufffd" not in joined:
                    b, text = end, joined
                    break
        out.append((a, b, text))
        a = b
    return out


def _sampled(tok: Any, traj: Trajectory, lo: int, hi: int, ours: list[float] | None) -> str:
    """Each sampled token a box (a character of several tokens: one box, each token in its
    tooltip), coloured by its |rollout - trainer| logprob gap (the largest of the box's)."""
    ids = traj.token_ids[lo:hi]
    out = []
    for a, b, text in _pieces(tok, ids):
        tips, gaps = [], []
        for pos in range(lo + a, lo + b):
            lp, tid = traj.logprobs[pos], traj.token_ids[pos]
            piece = tok.decode([tid], skip_special_tokens=False) if b - a > 1 else text
            tip = f"#{pos} id={tid} {piece!r} rollout={lp:.4f}"
            if ours is not None:
                gaps.append(abs(ours[pos] - lp))
                tip += f" trainer={ours[pos]:.4f} |Δ|={gaps[-1]:.2e}"
            tips.append(tip)
        gap = max(gaps) if gaps else None
        out.append(
            f'<span class="t" style="--d:{gap_colour(gap)}" '
            f'title="{_esc(chr(10).join(tips), attr=True)}">{_esc(text)}</span>'
        )
    return "".join(out)


def _trajectory(
    step: int, traj: Trajectory, tok: Any, lps: Sequence[float] | None, max_tokens: int, kind: str
) -> str:
    ours = _floats(lps) if lps is not None else None
    gaps = [g for g in turn_gaps(traj, ours) if g is not None]
    gap_txt = f" · |Δlogprob| mean {fmean(gaps):.1e}" if gaps else ""
    head = (  # plain text, escaped below as a whole: every part may be anyone's text
        f"{kind} {step} · {_clip(traj.task_id, 200)} #{traj.sample_index} · reward {traj.reward:g}"
        f" · stop {traj.stop_reason.value} · {len(traj.turns)} turns · {len(traj.token_ids)} "
        f"tokens ({traj.num_sampled} sampled){gap_txt}"
    )
    if traj.metadata.get("sequence") is not None:  # one of an episode's several sequences
        head += f" · sequence {traj.metadata['sequence']} of its episode"
        if rewrite := _rewrite(traj):  # rollout.context began it
            head += f" {rewrite}"
    head = _esc(head)
    if scoring(traj):
        head += f"<br>{_esc(_clip(scoring(traj), 2000))}"
    budget = max(max_tokens - traj.num_sampled, 128)
    prompt = _segment(tok, traj.token_ids[: traj.prompt_len], "p", "prompt", budget)
    # the system prompt and tool schemas are most of a card: folded, one click away
    parts = [
        f'<details class="pd"><summary>prompt ({traj.prompt_len} tokens: system, tools, task)'
        f"</summary>{prompt}</details>\n"
    ]
    shown = 0
    for k, t in enumerate(traj.turns):
        parts.append(f'<span class="b">assistant · turn {k} · {t.finish_reason.value}</span>')
        hi = min(t.end, t.start + max(max_tokens - shown, 0))
        parts.append(_sampled(tok, traj, t.start, hi, ours))
        if hi < t.end:
            parts.append(f'<span class="el"> … {t.end - hi} sampled tokens not shown</span>')
        shown += hi - t.start
        if t.obs_end > t.end:
            parts.append('<span class="b o2">observation</span>')
            obs = traj.token_ids[t.end : t.obs_end]
            parts.append(_segment(tok, obs, "o", "observation", budget))
    if traj.error:
        parts.append(f'\n<span class="b">error</span> {_esc(_clip(traj.error, 4000))}')
    return f'<div class="tr"><h3>{head}</h3><div class="body">{"".join(parts)}</div></div>'


def render_html(
    items: Sequence[tuple[int, Trajectory, Sequence[float] | None]],
    tokenizer: Any,
    max_tokens: int = 3000,
    title: str = "trajectories",
    kind: str = "step",
) -> str:
    """A standalone HTML page of whole trajectories: items are (step, trajectory, the trainer's
    per-token logprobs aligned with its token_ids, or None). No script: the colour switch is CSS.
    `kind` heads each card before its step: "step", or "eval after step" for evaluation episodes
    (eval_trajectories.jsonl)."""
    body = "".join(_trajectory(s, t, tokenizer, lp, max_tokens, kind) for s, t, lp in items)
    swatches = "".join(
        f'<span class="sw" style="background:{gap_colour(g)}"></span> {g:g} '
        for g in (1e-4, 1e-3, 3e-3, 1e-2, 3e-2, 1e-1)
    )
    return (
        f"<!doctype html><html><head><meta charset='utf-8'><title>{_esc(title, attr=True)}</title>"
        f"<style>{_CSS}</style></head><body>"
        '<input type="radio" name="view" id="vm" checked><label for="vm">colour by loss mask'
        '</label><input type="radio" name="view" id="vd"><label for="vd">colour by |rollout − '
        "trainer| logprob</label>"
        '<div class="legend"><span class="sw p"></span> prompt (mask 0) '
        '<span class="sw o"></span> observation (mask 0) '
        '<span class="sw" style="background:#cfe0ff"></span> sampled (mask 1) · '
        '<span class="lit">&lt;|x|&gt;</span> text that spells a special token · |Δ|: '
        f"{swatches}· grey: no trainer logprob · hover a token for its logprobs</div>"
        f'<div class="trajs">{body}</div></body></html>'
    )


# -- reading trajectories.jsonl (eval_trajectories.jsonl: the same lines) --------------------------
def trajectory_from_dict(d: dict[str, Any]) -> Trajectory:
    """Inverse of `Trajectory.to_dict` (extra keys such as step / trainer_logprobs ignored)."""
    return Trajectory.from_dict(d)


def _rows(path: Path, skipped: list[str] | None) -> list[tuple[int, dict[str, Any]]]:
    """(line number, JSON object) of each line of `path` that holds one. Lines are split at
    "\\n" only (a file written without ASCII escapes may hold U+2028 or \\x85 inside a line). A
    line that is not a JSON object is skipped, and said in `skipped`: the torn last line a
    running (or killed) run is still writing, garbage; bytes that are not UTF-8 are read as
    U+FFFD, and said."""
    out: list[tuple[int, dict[str, Any]]] = []
    note = skipped.append if skipped is not None else (lambda _: None)
    with path.open("rb") as f:
        for n, raw in enumerate(f, 1):
            if not raw.strip():
                continue
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError:
                text = raw.decode("utf-8", "replace")
                note(f"line {n}: bytes that are not UTF-8, read as U+FFFD")
            try:
                row = json.loads(text)
            except ValueError as e:
                torn = not raw.endswith(b"\n")  # the last line, still being written or cut
                note(f"line {n}: skipped, " + ("cut short (the run is writing it, or was "
                     "killed)" if torn else f"not JSON ({_clip(str(e), 100)})"))  # fmt: skip
                continue
            if not isinstance(row, dict):
                note(f"line {n}: skipped, a JSON {type(row).__name__}, not a trajectory")
                continue
            if not isinstance(row.get("step", 0), int):
                note(f"line {n}: skipped, its step {_clip(repr(row['step']), 40)} is not a number")
                continue
            out.append((n, row))
    return out


def load_jsonl(
    path: Path, step: int | None = None, skipped: list[str] | None = None
) -> list[tuple[int, Trajectory, list | None]]:
    """(step, trajectory, trainer logprobs or None) of one step (default: the last) of a run's
    trajectories.jsonl; a preview's file (no steps) is step 0. Lines that are not trajectories
    are skipped, each said in `skipped` (`_rows`)."""
    rows = _rows(path, skipped)
    if not rows:
        return []
    want = max(r.get("step", 0) for _, r in rows) if step is None else step
    out = []
    for n, r in rows:
        if r.get("step", 0) != want:
            continue
        try:
            out.append((want, trajectory_from_dict(r), r.get("trainer_logprobs")))
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            if skipped is not None:
                skipped.append(f"line {n}: skipped, not a trajectory ({type(e).__name__}: "
                               f"{_clip(str(e), 100)})")  # fmt: skip
    return out


def steps_in(path: Path, skipped: list[str] | None = None) -> list[int]:
    """The steps a trajectories.jsonl holds (a preview's: [0])."""
    return sorted({r.get("step", 0) for _, r in _rows(path, skipped)})
