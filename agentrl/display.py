"""Console views of trajectories and metrics (rich)."""

from __future__ import annotations

from rich.console import Console, Group
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from agentrl.types import Trajectory

_ROLE_STYLE = {"system": "dim", "user": "bold cyan", "assistant": "green", "tool": "yellow"}


def trajectory_panel(traj: Trajectory, max_chars: int = 600) -> Panel:
    """One trajectory, message by message, with its stop reason, reward and token counts."""
    parts = []
    raw = iter(t.text for t in traj.turns)
    for m in traj.messages:
        body = next(raw, m.content) if m.role == "assistant" else m.content
        body = body if len(body) <= max_chars else body[:max_chars] + " …"
        line = Text(f"{m.role:>9} │ ", style=_ROLE_STYLE[m.role])
        line.append(body)
        parts.append(line)
    if traj.error:
        parts.append(Text(f"error: {traj.error}", style="red"))
    title = (
        f"{traj.task_id} #{traj.sample_index} · stop={traj.stop_reason.value} · "
        f"reward={traj.reward:g} · turns={len(traj.turns)} · "
        f"tokens={len(traj.token_ids)} (sampled {traj.num_sampled})"
    )
    style = "red" if traj.stop_reason.is_infra_failure else "blue"
    return Panel(Group(*parts), title=title, title_align="left", border_style=style)


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
