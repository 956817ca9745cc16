"""Console views of trajectories and metrics (rich): the per-step progress line, trajectory panels,
metric tables."""

from __future__ import annotations

import math
import re
import sys
import time
from collections.abc import Mapping

from rich.console import Console, Group
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from agentrl.trajectory_view import scoring
from agentrl.types import Trajectory

# C0 controls but tab and newline, DEL, C1: what a model or its tool output may hold that a
# terminal would obey (ESC sequences recolour, retitle, move the cursor, OSC 52 writes the
# clipboard). Shown as \x1b etc. instead.
_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def safe_text(s: str) -> str:
    """`s` with every terminal control character written out (`\\x1b`), never obeyed."""
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", s)


_ROLE_STYLE = {"system": "dim", "user": "bold cyan", "assistant": "green", "tool": "yellow"}


def trajectory_panel(traj: Trajectory, max_chars: int = 600) -> Panel:
    """One trajectory, message by message, with its stop reason, reward and token counts."""
    parts = []
    raw = iter(t.text for t in traj.turns)
    for m in traj.messages:
        body = next(raw, m.content) if m.role == "assistant" else m.content
        body = body if len(body) <= max_chars else body[:max_chars] + " …"
        line = Text(f"{m.role:>9} │ ", style=_ROLE_STYLE[m.role])
        line.append(safe_text(body))
        parts.append(line)
    if scoring(traj):
        parts.append(Text(f"   scored │ {safe_text(scoring(traj))}", style="magenta"))
    if traj.error:
        parts.append(Text(f"error: {safe_text(traj.error)}", style="red"))
    title = safe_text(
        f"{traj.task_id} #{traj.sample_index} · stop={traj.stop_reason.value} · "
        f"reward={traj.reward:g} · turns={len(traj.turns)} · "
        f"tokens={len(traj.token_ids)} (sampled {traj.num_sampled})"
    )
    style = "red" if traj.stop_reason.is_infra_failure else "blue"
    return Panel(Group(*parts), title=title, title_align="left", border_style=style)


def make_console() -> Console:
    """The run's console. Into a pipe or a file (no terminal) a line is never broken at rich's
    80-column default: printed paths and commands stay whole, so they can be copied."""
    return Console(soft_wrap=not sys.stdout.isatty())


def metrics_table(metrics: dict[str, float], title: str = "metrics") -> Table:
    table = Table(title=title, show_header=False, box=None, padding=(0, 2))
    for k in sorted(metrics):
        v = metrics[k]
        if k.startswith("stop/") and v == 0:
            continue
        table.add_row(k, f"{v:.4g}")
    return table


def print_trajectories(trajs: list[Trajectory], console: Console | None = None) -> None:
    console = console or Console()
    for t in trajs:
        console.print(trajectory_panel(t))


# -- the per-step progress line -------------------------------------------------------------------
_PHASES = ("rollout", "logprobs", "update", "sync", "checkpoint")
_SHORT = {"rollout": "roll", "logprobs": "lp", "update": "upd", "checkpoint": "ckpt"}


def _duration(s: float) -> str:
    if s < 60:
        return f"{s:.1f}s"
    if s < 3600:
        return f"{int(s // 60)}m{int(s % 60):02d}s"
    return f"{int(s // 3600)}h{int(s % 3600 // 60):02d}m"


def _count(x: float) -> str:
    return f"{x / 1000:.1f}k" if x >= 1000 else f"{x:.0f}"


def progress_text(m: Mapping[str, float], total: int, eta_s: float | None = None) -> Text:
    """One step's line, e.g.

    step  3/20 ━━────────── reward 0.250 (max 1.00) tool-rate 0.60 turns 1.4 │ stop completed 14
    max_turns 2 │ 1.2k tok/s │ Δlp 2.1e-04 │ roll 3.8s lp 0.8s upd 3.6s sync 0.1s = 8.4s │ eta 2m23s

    (one line; wrapped here). Infrastructure stop reasons are red.
    """
    step = int(m.get("step", 0))
    width = len(str(total))
    done = round(12 * step / max(total, 1))
    line = Text().append(f"step {step:>{width}}/{total} ", style="bold")
    line.append("━" * done, style="green").append("─" * (12 - done), style="dim").append(" ")
    reward = m.get("reward/mean", math.nan)
    line.append("reward ").append(f"{reward:.3f}", style="bold cyan")
    line.append(f" (max {m.get('reward/max', math.nan):.2f}) ")
    line.append(f"tool-rate {m.get('rollout/tool_call_rate', 0.0):.2f} ")
    line.append(f"turns {m.get('rollout/turns', 0.0):.1f}")
    stops = [(k.removeprefix("stop/"), v) for k, v in m.items() if k.startswith("stop/") and v]
    if stops:
        line.append(" │ stop", style="dim")
        for reason, n in stops:
            bad = reason in ("sandbox_unavailable", "aborted")
            line.append(f" {reason} {int(n)}", style="red" if bad else "")
    tps = m.get("perf/sampled_tokens_per_s")
    if tps is not None:
        line.append(f" │ {_count(tps)} tok/s", style="dim")
    if "train/logprob_diff" in m:
        line.append(f" │ Δlp {m['train/logprob_diff']:.1e}", style="dim")
    if "train/kl_ref" in m:
        line.append(f" kl {m['train/kl_ref']:.1e}", style="dim")
    times = [(p, m[f"timing_s/{p}"]) for p in _PHASES if m.get(f"timing_s/{p}", 0.0) >= 0.05]
    if times:
        phases = " ".join(f"{_SHORT.get(p, p)} {_duration(s)}" for p, s in times)
        total_s = m.get("timing_s/step", sum(s for _, s in times))
        line.append(f" │ {phases} = {_duration(total_s)}", style="dim")
    if eta_s is not None and step < total:
        line.append(f" │ eta {_duration(eta_s)}", style="dim")
    return line


class ProgressLine:
    """Prints one `progress_text` line per step, with an ETA from the wall time of past steps."""

    def __init__(self, total: int, start_step: int = 0, console: Console | None = None) -> None:
        self.total, self.start_step = total, start_step
        self.console = console or Console()
        self.t0 = time.monotonic()

    def eta(self, step: int) -> float | None:
        done = step - self.start_step
        if done <= 0:
            return None
        return (time.monotonic() - self.t0) / done * (self.total - step)

    def __call__(self, m: Mapping[str, float]) -> None:
        eta = self.eta(int(m.get("step", 0)))
        self.console.print(progress_text(m, self.total, eta), soft_wrap=True)  # one line in logs
