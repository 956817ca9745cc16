"""Console views of trajectories and metrics (rich): the per-step progress line, trajectory panels,
metric tables."""

from __future__ import annotations

import logging
import math
import re
import sys
import time
from collections.abc import Mapping

from rich.console import Console, Group
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from agentrl.trajectory_view import scoring, written_out
from agentrl.types import Trajectory

# C0 controls but tab and newline, DEL, C1: what a model or its tool output may hold that a
# terminal would obey (ESC sequences recolour, retitle, move the cursor, OSC 52 writes the
# clipboard). Shown as \x1b etc. instead. And lone surrogates (a tool call's JSON "\ud800"
# decodes to one), which no stream can encode: printed, one would end the run.
_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\ud800-\udfff]")


def safe_text(s: str) -> str:
    """`s` with every terminal control character (`\\x1b`) and lone surrogate (`\\ud800`)
    written out, never obeyed."""
    return _CONTROL.sub(lambda m: written_out(m.group()), s)


_ROLE_STYLE = {"system": "dim", "user": "bold cyan", "assistant": "green", "tool": "yellow"}


def trajectory_panel(traj: Trajectory, max_chars: int = 600) -> Panel:
    """One trajectory, message by message, with its stop reason, reward and token counts. The
    last len(turns) assistant messages are the turns sampled on it, shown as sampled (tool-call
    markup and all); earlier ones (a later sequence's history) as written."""
    parts = []
    history = sum(m.role == "assistant" for m in traj.messages) - len(traj.turns)
    raw = iter([*([None] * max(history, 0)), *(t.text for t in traj.turns)])
    for m in traj.messages:
        body = next(raw, None) if m.role == "assistant" else None
        body = m.content if body is None else body
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
    80-column default: printed paths and commands stay whole, so they can be copied. Log records
    the console shows already (`extra={SHOWN: True}`) stay off the terminal's log handlers."""
    for handler in (logging.lastResort, *logging.getLogger().handlers):
        terminal = handler is logging.lastResort or getattr(handler, "stream", None) in (
            sys.stdout,
            sys.stderr,
        )
        if handler and terminal and not any(isinstance(f, _NotShownTwice) for f in handler.filters):
            handler.addFilter(_NotShownTwice())
    return Console(soft_wrap=not sys.stdout.isatty())


SHOWN = "agentrl_shown"  # a log record's extra: the console printed it (a guard's warning)


class _NotShownTwice(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not getattr(record, SHOWN, False)


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


# reward/<x> keys that are statistics of the reward, not components an env's reward dict returns
_REWARD_STATS = {"mean", "max", "min", "std", "turn_sum", "return_mean"}
_REWARD_STATS |= {f"{s}_all" for s in ("mean", "max", "min", "std")}  # dynamic sampling's


def _components(m: Mapping[str, float], prefix: str) -> str:
    """The reward's components, e.g. `correct 0.20 format 0.95` (`prefix`: `reward/` or, for an
    evaluation, `eval/reward_`); '' for an env whose reward is one number."""
    parts = [
        f"{k.removeprefix(prefix)} {v:.2f}"
        for k, v in m.items()
        if k.startswith(prefix) and k.removeprefix(prefix) not in _REWARD_STATS
    ]
    return " ".join(parts)


def _env_rewards(m: Mapping[str, float], scope: str) -> str:
    """A mixture's reward per env (env=mixture), e.g. ` │ code 0.50 units 0.25`: `scope` `env/`
    for a step (env/<name>/reward_mean; under dynamic sampling env/<name>/reward_mean_all, every
    group sampled, as the step's own reward), `eval/` for an evaluation; '' for a single env."""
    parts = [
        f"{k.split('/')[1]} {m.get(k + '_all', v):.2f}"
        for k, v in m.items()
        if k.startswith(scope) and k.endswith("/reward_mean") and k.count("/") == 2
    ]
    return f" │ {safe_text(' '.join(parts))}" if parts else ""


def _sequences_per_episode(m: Mapping[str, float]) -> float:
    """rollout/* means are per trajectory (sequence); times this, per episode (an episode is
    several sequences under rollout.thinking=template or a context rewrite)."""
    return m.get("rollout/sequences_per_episode", 1.0)


def _tool_failures(m: Mapping[str, float], scope: str = "") -> Text:
    """` │ python 40 calls: err 9 exc 3 · lookup 9 calls: err 2`: each tool with failed calls,
    the model's errors and the tool's own exceptions (red), out of its calls; nothing when every
    call worked. Without per-tool numbers (an env whose `step` reports only counts) the means
    per episode: ` │ tool err 0.40 exc 0.10 /episode`. `scope`: '' for a training step, `eval/`
    for an evaluation."""
    prefix = f"{scope}tools/"
    calls = [k for k in m if k.startswith(prefix) and k.endswith("/calls")]
    names = [k[len(prefix) : -len("/calls")] for k in calls]
    out = Text()
    for name in names:
        err, exc = m.get(f"{prefix}{name}/errors", 0.0), m.get(f"{prefix}{name}/exceptions", 0.0)
        if not (err or exc):
            continue
        out.append(" · " if out else " │ ", style="dim")
        out.append(f"{safe_text(name)} {int(m[f'{prefix}{name}/calls'])} calls:")
        if err:
            out.append(f" err {int(err)}", style="yellow")
        if exc:
            out.append(f" exc {int(exc)}", style="red")
    if names:
        return out
    group = scope or "rollout/"
    per = 1.0 if scope else _sequences_per_episode(m)  # eval/*: per episode already
    err, exc = (m.get(f"{group}{k}", 0.0) * per for k in ("tool_errors", "tool_exceptions"))
    if err or exc:
        out.append(" │ tool")
        if err:
            out.append(f" err {err:.2f}", style="yellow")
        if exc:
            out.append(f" exc {exc:.2f}", style="red")
        out.append(" /episode", style="dim")
    return out


def progress_text(m: Mapping[str, float], total: int, eta_s: float | None = None) -> Text:
    """One step's line, e.g.

    step  3/20 ━━────────── reward 0.250 (max 1.00; correct 0.20 format 0.95) tool-rate 0.60
    turns 1.4 │ stop completed 14 max_turns 2 │ python 40 calls: err 9 exc 3 │ 1.2k tok/s │
    Δlp 2.1e-04 │ roll 3.8s lp 0.8s upd 3.6s sync 0.1s = 8.4s │ eta 2m23s

    (one line; wrapped here). Turns and tool failures are per episode (however many sequences
    it is). The reward is every episode's (reward/mean), under dynamic
    sampling every sampled one's (reward/mean_all: `reward 0.310 (kept groups 0.500, max 1.00)`,
    the kept groups' mean beside it). Shown only when there is something to show: the reward's
    components (an env whose reward is a dict), each env's reward (env=mixture: `│ code 0.50
    units 0.25` after the turns), the stop reasons that happened (infrastructure
    ones red), the tools that had failed calls (the model's errors yellow, the tool's own
    exceptions red).
    """
    step = int(m.get("step", 0))
    width = len(str(total))
    done = round(12 * step / max(total, 1))
    line = Text().append(f"step {step:>{width}}/{total} ", style="bold")
    line.append("━" * done, style="green").append("─" * (12 - done), style="dim").append(" ")
    sampled = "reward/mean_all" in m  # dynamic sampling: reward/* is the kept groups' only
    reward = m.get("reward/mean_all" if sampled else "reward/mean", math.nan)
    line.append("reward ").append(f"{reward:.3f}", style="bold cyan")
    parts = _components(m, "reward/")
    kept = f"kept groups {m.get('reward/mean', math.nan):.3f}, " if sampled else ""
    top = m.get("reward/max_all" if sampled else "reward/max", math.nan)
    line.append(f" ({kept}max {top:.2f}")
    line.append(f"; {safe_text(parts)}) " if parts else ") ")
    line.append(f"tool-rate {m.get('rollout/tool_call_rate', 0.0):.2f} ")
    line.append(f"turns {m.get('rollout/turns', 0.0) * _sequences_per_episode(m):.1f}")
    line.append(_env_rewards(m, "env/"))
    stops = [(k.removeprefix("stop/"), v) for k, v in m.items() if k.startswith("stop/") and v]
    if stops:
        line.append(" │ stop", style="dim")
        for reason, n in stops:
            bad = reason in ("sandbox_unavailable", "aborted")
            line.append(f" {reason} {int(n)}", style="red" if bad else "")
    line.append_text(_tool_failures(m))
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


def eval_text(m: Mapping[str, float], step: int, tasks: int, samples: int) -> Text:
    """An evaluation's line, e.g. `eval after step 10: reward 0.450 (correct 0.45 format 0.98)
    over 32 tasks x 4 (3.1 s) │ python 128 calls: err 12` (components, a mixture's envs and
    failing tools only when there are any, as on the step line)."""
    line = Text(f"eval after step {step}: reward ")
    line.append(f"{m.get('eval/reward_mean', math.nan):.3f}", style="bold cyan")
    if parts := _components(m, "eval/reward_"):
        line.append(f" ({safe_text(parts)})")
    line.append(f" over {tasks} tasks x {samples} ({m.get('eval/timing_s', 0.0):.1f} s)")
    line.append(_env_rewards(m, "eval/"))
    return line.append_text(_tool_failures(m, "eval/"))


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
