"""Metric names and reductions. Names are stable: dashboards and tests key on them.

    reward/mean, reward/max, reward/<component>        over trajectories (infra failures excluded)
    rollout/turns, rollout/tool_calls, rollout/tool_call_rate, rollout/parse_errors,
    rollout/tool_errors, rollout/sampled_tokens, rollout/obs_tokens, rollout/tool_latency_s,
    rollout/gen_latency_s, rollout/truncated_obs_tokens
    stop/<reason>                                      count per StopReason
"""

from __future__ import annotations

from collections import Counter
from statistics import fmean

from agentrl.types import StopReason, Trajectory


def rollout_metrics(trajs: list[Trajectory]) -> dict[str, float]:
    """Reduce one step's trajectories to scalars.

    tool_call_rate: fraction of assistant turns that tried to call a tool (valid or malformed) —
    the number to watch when a model's output format and the parser disagree.
    """
    if not trajs:
        return {}
    scored = [t for t in trajs if not t.stop_reason.is_infra_failure]
    turns = [turn for t in trajs for turn in t.turns]
    out: dict[str, float] = {f"stop/{r.value}": 0.0 for r in StopReason}
    for reason, n in Counter(t.stop_reason for t in trajs).items():
        out[f"stop/{reason.value}"] = float(n)
    if scored:
        out["reward/mean"] = fmean(t.reward for t in scored)
        out["reward/max"] = max(t.reward for t in scored)
        out["reward/min"] = min(t.reward for t in scored)
        for key in sorted({k for t in scored for k in t.reward_components} - {"total"}):
            out[f"reward/{key}"] = fmean(t.reward_components.get(key, 0.0) for t in scored)
    n = len(trajs)
    out["rollout/trajectories"] = float(n)
    out["rollout/turns"] = len(turns) / n
    out["rollout/tool_calls"] = sum(t.num_tool_calls for t in turns) / n
    out["rollout/tool_call_rate"] = (
        sum(1 for t in turns if t.num_tool_calls or t.num_parse_errors) / len(turns) if turns else 0.0
    )
    out["rollout/parse_errors"] = sum(t.num_parse_errors for t in turns) / n
    out["rollout/tool_errors"] = sum(t.num_tool_errors for t in turns) / n
    out["rollout/sampled_tokens"] = float(sum(t.num_sampled for t in trajs))
    out["rollout/obs_tokens"] = float(sum(t.obs_end - t.end for t in turns))
    out["rollout/truncated_obs_tokens"] = float(sum(t.truncated_obs_tokens for t in turns))
    out["rollout/tool_latency_s"] = fmean(t.tool_latency_s for t in turns) if turns else 0.0
    out["rollout/gen_latency_s"] = fmean(t.gen_latency_s for t in turns) if turns else 0.0
    return out
