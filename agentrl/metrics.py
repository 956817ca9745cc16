"""Metric names and reductions. Names are stable: dashboards, sinks and tests key on them.

One step of `python -m agentrl.train` logs one flat dict (metrics.jsonl, W&B history, the console
line) with these names; `step_metrics` below is the one place that builds the final names.
Size: one module, since this docstring is the reference of every name and the code beside it is
what computes each; split, a name and its meaning would drift apart.

reward/ — over the step's episodes (one per episode of several sequences), infrastructure
    failures excluded: the groups trained, so under trainer.sampling.dynamic_sampling the kept
    groups only, whose rewards differ by construction (reward/*_all: every group sampled; the
    console's reward and the run's done: line are then reward/mean_all)
    reward/mean, reward/max, reward/min, reward/std     the outcome reward (Trajectory.reward)
    reward/<component>              mean of each named component an env's reward dict returns
    reward/turn_sum                 per-turn rewards (StepResult.reward) summed per episode
                                    (over all its sequences' turns), mean; only when an env gives
                                    them (trained on with algo.advantage.reward_level=turn only)
    reward/return_mean              outcome + per-turn rewards per episode, mean (with them)
    reward/mean_all, reward/max_all, reward/min_all, reward/std_all
                                    trainer.sampling.dynamic_sampling: reward/mean, max, min, std
                                    over every group rolled out this step, the filtered ones too
                                    (async: those not dropped as stale): the policy's reward
rollout/ — what the rollout produced (per-trajectory means unless the name says otherwise)
    rollout/trajectories            trajectories this step (count)
    rollout/turns, rollout/turns_max                    assistant turns per trajectory
    rollout/tool_calls              tool calls that succeeded, per trajectory (Turn.num_tool_calls)
    rollout/tool_call_rate          fraction of assistant turns that tried to call a tool
                                    (succeeded, failed or malformed)
    rollout/parse_errors, rollout/tool_errors           per trajectory (the model's faults)
    rollout/tool_exceptions                             per trajectory: the tool's own code failed
    rollout/failing_tools           tools that failed on more than
                                    trainer.guards.warn_tool_fail_rate of their calls this step (with at least TOOL_WARN_MIN_CALLS
                                    calls); each is warned about (console, log, W&B alert): at
                                    the first such step, then every TOOL_WARN_EVERY steps
tools/<name>/ — per tool the env has, over the step's calls, when it was called (totals; from
    Turn.tool_outcomes, so an env whose own step reports only counts has none); a name the env
    does not have is `tools/(unknown)/`
    tools/<name>/calls              calls made (succeeded + errors + exceptions)
    tools/<name>/errors             … that failed by the model's fault (bad arguments, timeout,
                                    its code failed)
    tools/<name>/exceptions         … that failed by the tool's fault (its own code raised)
    tools/<name>/fail_rate          (errors + exceptions) / calls
    tools/<name>/tampered           … whose code wrote to the sandbox's control channel (an
                                    attack on the sandbox, caught: ToolOutcome.tampered); only
                                    in a step that has some
    rollout/sampled_tokens          sampled (loss-mask 1) tokens, total over the step
    rollout/sequences_per_episode   1, unless an agent rewrote its history or thinking=template
    rollout/tokens                  every id of every sequence (what the learner runs over)
    rollout/routed_positions        positions whose experts the engine returned (routing replay)
    rollout/rewrites, rollout/rewrite_tokens_before, rollout/rewrite_tokens_after   history
                                    rewrites per episode (rollout.context), prompt ids around them
    rollout/rewrite_tokens_dropped  the ids those rewrites took out of the prompts (before - after)
    rollout/sampled_tokens_per_traj, rollout/traj_tokens_mean, rollout/traj_tokens_max
    rollout/obs_tokens, rollout/truncated_obs_tokens    observation tokens, totals
    rollout/truncated               episodes a token budget cut (stop/length + stop/context_overflow:
                                    `advantage.is_truncated`), count, whatever rollout.truncated
    rollout/truncated_masked, rollout/truncated_penalised   … of which rollout.truncated=mask
                                    trained on none of their tokens / =penalise scored with
                                    rollout.truncated_reward (reward/* keeps the env's reward)
    rollout/tool_latency_s, rollout/tool_latency_s_max  per turn that called a tool
    rollout/gen_latency_s           engine latency per assistant turn
    rollout/prefix_cache_hit        prompt tokens the engine's prefix cache held / prompt tokens
                                    read, over all turns (SGLang's cached_tokens; the dev
                                    server's prefix cache counts the same way)
    rollout/off_version_turns       trainer.mode=sync: turns an engine sampled with other weights
                                    than the trainer's current version (a push that did not
                                    reach it; warned loudly); always 0 when pushes land
    rollout/prefix_cache_hit_first, rollout/prefix_cache_hit_later   … first turns only (the
                                    task's prompt, shared by its group) / later turns only (the
                                    episode's own history: what turn continuation keeps hot)
stop/<reason> — trajectories that ended with each StopReason (all reasons, 0 included)
adv/* — the advantage estimator's own numbers (agentrl/advantage.py): mean, std, max, min, …
eval/ — trainer.eval.every's fixed set (agentrl/evaluate.py), on the steps it runs (and step 0)
    eval/reward_mean, eval/reward_std, eval/reward_<component>
    eval/tool_call_rate, eval/turns, eval/parse_errors      as rollout/*, per eval episode
    eval/tool_calls, eval/tool_errors, eval/tool_exceptions  (and eval/tools/<name>/* as tools/)
    eval/episodes, eval/failed      episodes rolled out / not scored (infrastructure failures);
                                    an episode of several sequences counts once
    eval/timing_s                   seconds the evaluation took (not in timing_s/step)
    eval/<env>/…                    env=mixture: the same names over one env's evaluation set
env/<env>/ — env=mixture (agentrl/mixture.py): each env's part of the step, over its own groups
    env/<env>/groups                its groups this step (0 when it drew none; the rest absent)
    env/<env>/reward_mean, reward_std, reward_<component>   as reward/*
    env/<env>/reward_mean_all       as reward/mean_all (dynamic sampling: every group sampled)
    env/<env>/trajectories, tool_call_rate, turns, tool_calls, tool_errors, tool_exceptions,
        parse_errors, sampled_tokens, truncated      as rollout/*; failed: infrastructure failures
train/ — the learner and the trainer-side logprob pass
    train/loss, train/pg_loss       the optimized loss and its policy-gradient part
    train/clipfrac                  fraction of sampled tokens whose ratio was clipped (sum of:)
    train/clipfrac_low, train/clipfrac_high, train/clipfrac_dual
    train/approx_kl                 KL(old ‖ new) estimated from the PPO ratio
    train/kl_ref                    KL(policy ‖ reference) on sampled tokens, before the update (k3)
    train/kl_ref_loss               the KL term inside the loss (algo.loss.kl_kind), when on
    train/entropy                   per-token policy entropy: exact from the loss when
                                    algo.loss.entropy_coef > 0, otherwise the Monte-Carlo estimate
                                    mean(-log pi_trainer(sampled token)) (unbiased at temperature,
                                    without top-p/top-k truncation)
    train/grad_norm, train/lr, train/skipped, train/skipped_steps_in_a_row
    train/logprob_diff, train/logprob_diff_max   mean / max |rollout - trainer| logprob, sampled
    train/ratio_mean, train/ratio_max, train/ratio_min   pi / pi_old (algo.loss.ratio)
    train/is_weight_mean, _max, _min, train/is_capped_frac | train/is_masked_frac
                                    rollout correction weights pi_old / pi_engine (tis | mis)
    train/rollout_logprob_diff      mean |log pi_old - log pi_engine| seen by the loss
    train/zero_grad_seq_frac, train/zero_grad_token_frac   share of sequences / tokens whose
                                    policy-gradient term is exactly 0 (clipped, masked, A = 0)
    train/optimizer_steps           optimizer steps this step (algo.ppo_epochs x mini_batches)
    train/kl_reward_penalty         kl_mode=reward: KL penalty summed per trajectory, mean
    train/empty_steps_in_a_row, train/no_signal_steps_in_a_row   see trainer.guards.max_empty_steps,
                                    trainer.guards.no_signal_steps
    train/tokens, train/loss_tokens, train/micro_batches, train/step_s (learner wall time):
                                    sums over the step's optimizer steps
    train/batch_tokens              every token the update ran over (prompts, observations too)
    train/checkpointed_blocks       transformer blocks recomputed in backward this step
                                    (learner.activation_checkpointing=auto picks them per step)
    train/alloc_retries             CUDA allocations retried after emptying the cache (memory at
                                    its limit: slow, warned about); 0 on CPU
    train/alloc_retries_optimizer   of those, the ones in the optimizer step (clipping, Adam):
                                    after the activations were freed, so no micro-batch size helps
    Any other learner key `policy/<k>` becomes `train/<k>`; other roles keep their prefix
    (`critic/…`).
sync/ — weight sync: seconds, mb, s_per_mb, buckets; drain_s (closing the gate before the push:
    pausing the servers, or with trainer.async.partial_rollouts=false waiting for the turns in
    flight; 0 in sync mode); cut_turns (turns the push cut, to go on under the new weights)
async/ — trainer.mode=async (agentrl/producer.py), over the groups this step trains
    async/staleness_mean, async/staleness_max   versions between the weights that sampled a
                                    trajectory's oldest turn and the weights this step updates
    async/dropped                   groups dropped as staler than trainer.async.max_staleness
    async/partial_turns             trained turns sampled under two or more weight versions (cut
                                    by a push and continued: trainer.async.partial_rollouts)
    async/queued, async/in_flight   finished groups waiting / groups being rolled out, when taken
engine/restarts — rollout servers restarted this step (died or hung; engine.max_restarts each)
rollout/oversampled_dropped — groups launched beyond trainer.tasks_per_step and aborted once
    enough had finished (trainer.sampling.oversample_groups)
rollout/filtered_groups, rollout/refill_rounds — trainer.sampling.dynamic_sampling: groups
    dropped for carrying no gradient (`advantage.carries_gradient`: every advantage 0), and (sync) the extra
    rollout rounds run to replace them
sandbox/restarts — the sandbox service this run started, restarted this step (it died;
    sandbox.max_restarts per run)
rollout/reissued — episodes rolled out again this step because a server or the sandbox failed
    under them (whole groups, so each group's baseline compares samples of one policy)
timing_s/<phase> — wall seconds of each phase (rollout — in async mode the wait for finished
    groups —, advantage, to_learner, logprobs, update,
    sync, checkpoint); timing_s/step is their sum
perf/ — throughput
    perf/sampled_tokens_per_s       sampled tokens / rollout time
    perf/train_tokens_per_s         all tokens the learner processed / update time
    perf/step_tokens_per_s          sampled tokens / whole step time
step — optimizer steps completed (the x axis)
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from statistics import fmean

import torch

from agentrl.advantage import Truncation, is_truncated
from agentrl.loss import kl_estimate
from agentrl.types import StopReason, Trajectory

# Learner keys (agentrl/loss.py, agentrl/learner/worker.py) → documented names, for role "policy".
TRAIN_NAMES: dict[str, str] = {
    "pg_clipfrac_low": "clipfrac_low",
    "pg_clipfrac_high": "clipfrac_high",
    "pg_clipfrac_dual": "clipfrac_dual",
    "kl_ref": "kl_ref_loss",  # train/kl_ref is the pre-update measurement of the trainer
}
_CLIPFRACS = ("train/clipfrac_low", "train/clipfrac_high", "train/clipfrac_dual")


def one_per_episode(trajs: Sequence[Trajectory]) -> list[Trajectory]:
    """The first trajectory of each episode: an episode of several sequences (an agent's, or one
    rollout.thinking=template or rollout.context rewrote) is one reward, counted once."""
    seen: set[object] = set()
    out = []
    for t in trajs:
        key = _episode(t)
        if key not in seen:
            seen.add(key)
            out.append(t)
    return out


def reward_metrics(scored: Sequence[Trajectory]) -> dict[str, float]:
    """reward/* over the scored episodes (infrastructure failures left out; none: {}), each
    counted once however many sequences it has (`one_per_episode`); its per-turn rewards are
    those of the turns of all its sequences (each sampled in one of them)."""
    turn_sums = _turn_sums(scored)
    scored = one_per_episode(scored)
    if not scored:
        return {}
    rewards = [t.reward for t in scored]
    mean = fmean(rewards)
    out = {"reward/mean": mean, "reward/max": max(rewards), "reward/min": min(rewards)}
    out["reward/std"] = fmean((r - mean) ** 2 for r in rewards) ** 0.5  # NaN stays NaN
    for key in sorted({k for t in scored for k in t.reward_components} - {"total"}):
        out[f"reward/{key}"] = fmean(t.reward_components.get(key, 0.0) for t in scored)
    if turn_sums:
        out["reward/turn_sum"] = fmean(turn_sums.get(_episode(t), 0.0) for t in scored)
        out["reward/return_mean"] = mean + out["reward/turn_sum"]
    return out


def _episode(t: Trajectory) -> object:
    return t.metadata.get("session") or id(t)


def _turn_sums(trajs: Sequence[Trajectory]) -> dict[object, float]:
    """Per episode (`one_per_episode`'s key) with a per-turn reward: the sum over its sequences'
    turns; {} when no turn has one (an env that gives none)."""
    out: dict[object, float] = {}
    for t in trajs:
        for turn in t.turns:
            if turn.reward is not None:
                out[_episode(t)] = out.get(_episode(t), 0.0) + turn.reward
    return out


def rollout_metrics(
    trajs: list[Trajectory], truncation: Truncation | None = None
) -> dict[str, float]:
    """Reduce one step's trajectories to scalars.

    tool_call_rate: fraction of assistant turns that tried to call a tool (valid or malformed) —
    the number to watch when a model's output format and the parser disagree. `truncation`:
    rollout.truncated, for the rollout/truncated_* counts.
    """
    if not trajs:
        return {}
    turns = [turn for t in trajs for turn in t.turns]
    out: dict[str, float] = {f"stop/{r.value}": 0.0 for r in StopReason}
    for reason, n in Counter(t.stop_reason for t in trajs).items():
        out[f"stop/{reason.value}"] = float(n)
    out.update(reward_metrics([t for t in trajs if not t.stop_reason.is_infra_failure]))
    n = len(trajs)
    tool_turns = [t for t in turns if t.num_tool_attempts]
    out["rollout/trajectories"] = float(n)
    out.update(sequence_metrics(trajs))
    out["rollout/turns"] = len(turns) / n
    out["rollout/turns_max"] = float(max(len(t.turns) for t in trajs))
    out["rollout/tool_calls"] = sum(t.num_tool_calls for t in turns) / n
    out["rollout/tool_call_rate"] = (
        sum(1 for t in turns if t.num_tool_attempts or t.num_parse_errors) / len(turns)
        if turns
        else 0.0
    )
    out["rollout/parse_errors"] = sum(t.num_parse_errors for t in turns) / n
    out["rollout/tool_errors"] = sum(t.num_tool_errors for t in turns) / n
    out["rollout/tool_exceptions"] = sum(t.num_tool_exceptions for t in turns) / n
    out["rollout/sampled_tokens"] = float(sum(t.num_sampled for t in trajs))
    out["rollout/sampled_tokens_per_traj"] = out["rollout/sampled_tokens"] / n
    out["rollout/traj_tokens_mean"] = fmean(len(t.token_ids) for t in trajs)
    out["rollout/traj_tokens_max"] = float(max(len(t.token_ids) for t in trajs))
    out["rollout/obs_tokens"] = float(sum(t.obs_end - t.end for t in turns))
    out["rollout/truncated_obs_tokens"] = float(sum(t.truncated_obs_tokens for t in turns))
    episodes = one_per_episode(trajs)  # an episode's sequences share its stop reason
    out["rollout/truncated"] = float(sum(is_truncated(t) for t in episodes))
    truncation = truncation or Truncation()
    out["rollout/truncated_masked"] = float(sum(truncation.masked(t) for t in episodes))
    out["rollout/truncated_penalised"] = float(sum(truncation.penalised(t) for t in episodes))
    out["rollout/tool_latency_s"] = (
        fmean(t.tool_latency_s for t in tool_turns) if tool_turns else 0.0
    )
    out["rollout/tool_latency_s_max"] = max((t.tool_latency_s for t in tool_turns), default=0.0)
    out["rollout/gen_latency_s"] = fmean(t.gen_latency_s for t in turns) if turns else 0.0
    first = [tr.turns[0] for tr in trajs if tr.turns]
    later = [t for tr in trajs for t in tr.turns[1:]]
    for name, ts in (("", turns), ("_first", first), ("_later", later)):
        read = sum(t.prompt_tokens for t in ts)
        out[f"rollout/prefix_cache_hit{name}"] = (
            sum(t.cached_tokens for t in ts) / read if read else 0.0
        )
    out.update(tool_metrics(trajs))
    out.update(gateway_metrics(trajs))
    return out


def sequence_metrics(trajs: list[Trajectory]) -> dict[str, float]:
    """Sequences per episode, every id they hold, and the positions routed (routing replay)."""
    episodes = len(one_per_episode(trajs))
    out = {"rollout/sequences_per_episode": len(trajs) / episodes,
           "rollout/tokens": float(sum(len(t.token_ids) for t in trajs))}  # fmt: skip
    rewrites = [t.metadata["rewrite"] for t in trajs if t.metadata.get("rewrite")]
    if rewrites or any(t.stop_reason is StopReason.CONTEXT_OVERFLOW for t in trajs):
        out["rollout/rewrites"] = len(rewrites) / episodes
        out["rollout/rewrite_tokens_before"] = float(sum(b for b, _ in rewrites))
        out["rollout/rewrite_tokens_after"] = float(sum(a for _, a in rewrites))
        out["rollout/rewrite_tokens_dropped"] = float(sum(b - a for b, a in rewrites))
    routed = [len(t.routes) for t in trajs if t.routes is not None]
    if routed:  # learner.routing_replay
        out["rollout/routed_positions"] = float(sum(routed))
    return out


GATEWAY_COUNTS = ("requests", "sequences", "start", "extend", "branch", "fork", "template",
                  "bad_requests", "parse_errors", "sampling_overridden", "tool_calls")  # fmt: skip


def gateway_metrics(trajs: list[Trajectory]) -> dict[str, float]:
    """An AgentEnv's episodes (agentrl/gateway/): per step, the requests its agents made and how
    each was captured (start, extend, branch, fork, template: agentrl/gateway/capture.py), requests
    refused (bad_requests), parse errors, requests whose own temperature/top_p were overridden, and
    `gateway/fork_rate` (forks per request: the agents' history rewrites)."""
    counts: Counter[str] = Counter()
    seen = False
    for t in trajs:
        seen = seen or "gateway" in t.metadata
        for k, v in t.metadata.get("gateway", {}).items():
            counts[k] += v
    if not seen:
        return {}
    out = {f"gateway/{k}": float(counts[k]) for k in GATEWAY_COUNTS}
    out.update({f"gateway/{k}": float(v) for k, v in counts.items()})
    out["gateway/fork_rate"] = counts["fork"] / counts["requests"] if counts["requests"] else 0.0
    return out


# -- per tool -------------------------------------------------------------------------------------
TOOL_WARN_MIN_CALLS = 8  # calls of one tool in a step before its failure share is judged
TOOL_WARN_EVERY = 10  # steps between repeats of the warning while a tool goes on failing


@dataclass
class ToolStats:
    """One tool's calls in one step: how many, how many failed and how, and the error messages
    (the most common one is the example a warning shows)."""

    calls: int = 0
    errors: int = 0  # the model's fault
    exceptions: int = 0  # the tool's fault
    tampered: int = 0  # errors whose code attacked the sandbox (ToolOutcome.tampered)
    error_messages: Counter[str] = field(default_factory=Counter)
    exception_messages: Counter[str] = field(default_factory=Counter)

    @property
    def failed(self) -> int:
        return self.errors + self.exceptions

    @property
    def fail_rate(self) -> float:
        return self.failed / self.calls if self.calls else 0.0

    def example(self) -> str:
        """The most common error message, the tool's own exceptions before the model's errors."""
        for messages in (self.exception_messages, self.error_messages):
            if messages:
                return messages.most_common(1)[0][0]
        return ""


def tool_stats(trajs: Sequence[Trajectory]) -> dict[str, ToolStats]:
    """Per tool name, sorted: the step's calls (`Turn.tool_outcomes`)."""
    out: dict[str, ToolStats] = {}
    for tr in trajs:
        for turn in tr.turns:
            for o in turn.tool_outcomes:
                s = out.setdefault(o.name, ToolStats())
                s.calls += 1
                s.tampered += o.tampered
                if o.status == "error":
                    s.errors += 1
                    s.error_messages[o.message] += 1
                elif o.status == "exception":
                    s.exceptions += 1
                    s.exception_messages[o.message] += 1
    return dict(sorted(out.items()))


def tool_metrics(trajs: Sequence[Trajectory]) -> dict[str, float]:
    """`tools/<name>/calls`, `/errors`, `/exceptions`, `/fail_rate` of each tool called (totals
    over the step: the module docstring)."""
    out: dict[str, float] = {}
    for name, s in tool_stats(trajs).items():
        out[f"tools/{name}/calls"] = float(s.calls)
        out[f"tools/{name}/errors"] = float(s.errors)
        out[f"tools/{name}/exceptions"] = float(s.exceptions)
        out[f"tools/{name}/fail_rate"] = s.fail_rate
        if s.tampered:
            out[f"tools/{name}/tampered"] = float(s.tampered)
    return out


class ToolWatch:
    """Says, loudly, when a tool fails on more than `bar` of its calls in a step (at least
    `min_calls` of them): the policy then trains on episodes whose tool answered with errors, and
    a reward that counts calls may be paying for failures. It warns at the first such step,
    again every `every` steps while the tool goes on failing (a broken tool stays in view
    without a line every step), and notes once when it recovers. A step with fewer than
    `min_calls` calls of a tool leaves its state as it was. `bar` 0: off.

        watch = ToolWatch(bar=0.5)
        metrics, warnings, notes = watch.update(trajs, step=3)  # {"rollout/failing_tools": 1.0}
    """

    def __init__(
        self, bar: float, min_calls: int = TOOL_WARN_MIN_CALLS, every: int = TOOL_WARN_EVERY
    ) -> None:
        self.bar, self.min_calls, self.every = bar, min_calls, every
        self.since: dict[str, int] = {}  # a failing tool → the step it began failing
        self.warned: dict[str, int] = {}  # … → the step it was last warned about

    def update(
        self, trajs: Sequence[Trajectory], step: int
    ) -> tuple[dict[str, float], list[str], list[str]]:
        """(`rollout/failing_tools`, the warnings to give now, the notes of tools that
        recovered) for the trajectories of `step`."""
        if not self.bar:
            return {"rollout/failing_tools": 0.0}, [], []
        judged = {n: s for n, s in tool_stats(trajs).items() if s.calls >= self.min_calls}
        failing = {n: s for n, s in judged.items() if s.fail_rate > self.bar}
        warnings, notes = [], []
        for name, s in failing.items():
            since = self.since.setdefault(name, step)
            if since == step or step - self.warned[name] >= self.every:
                self.warned[name] = step
                warnings.append(self._message(name, s, step, since))
        for name in [n for n in judged if n not in failing and n in self.since]:
            notes.append(
                f"tool {name!r} recovered at step {step}: {judged[name].failed} of "
                f"{judged[name].calls} calls failed (failing since step {self.since[name]})"
            )
            del self.since[name], self.warned[name]
        return {"rollout/failing_tools": float(len(failing))}, warnings, notes

    def _message(self, name: str, s: ToolStats, step: int, since: int) -> str:
        what = (
            f"tool {name!r} failed on {s.failed} of {s.calls} calls in step {step}"
            if since == step
            else f"tool {name!r} still fails: {s.failed} of {s.calls} calls in step {step} "
            f"(since step {since})"
        )
        if s.exceptions >= s.errors:
            why = (
                "Mostly the tool's own code raising: a bug in the tool or in what it relies on "
                "(a service, a file, a key); its traceback is in the log, once per tool class."
            )
        else:
            why = (
                "Mostly the model's calls failing (bad arguments, its code, timeouts): check the "
                "tool's description, its Args and timeout, and the episodes (`agentrl view RUN`)."
            )
        return (
            f"{what}, above trainer.guards.warn_tool_fail_rate={self.bar:g}: {s.exceptions} "
            f"raised in the tool, {s.errors} were the model's errors; e.g. {s.example()!r}. {why} Training "
            f"goes on with these errors as observations. Said again every {self.every} steps "
            "while it lasts (trainer.guards.warn_tool_fail_rate=0: off)"
        )


def metric_name(key: str) -> str:
    """The documented name of a raw metric key: `policy/<k>` (the learner's) → `train/<k'>`."""
    role, sep, rest = key.partition("/")
    if role == "policy" and sep:
        return f"train/{TRAIN_NAMES.get(rest, rest)}"
    return key


def logprob_metrics(
    trajs: Sequence[Trajectory], trainer_logprobs: Mapping[int, Sequence[float]]
) -> dict[str, float]:
    """From the trainer's per-token logprobs (aligned with each trajectory's token_ids, keyed by
    index into `trajs`): the largest rollout/trainer gap and the sampled-token entropy estimate."""
    gap_max, neg_lp, n = 0.0, 0.0, 0
    for i, lps in trainer_logprobs.items():
        t = trajs[i]
        for m, ours, theirs in zip(t.loss_mask, _floats(lps), t.logprobs, strict=True):
            if m:
                gap_max = max(gap_max, abs(ours - theirs))
                neg_lp -= ours
                n += 1
    if not n:
        return {}
    return {"train/logprob_diff_max": gap_max, "train/entropy_estimate": neg_lp / n}


def _floats(x: Sequence[float]) -> list[float]:
    return x.tolist() if hasattr(x, "tolist") else list(x)  # a torch tensor or a list


def step_metrics(
    raw: Mapping[str, float],
    trajs: Sequence[Trajectory] = (),
    trainer_logprobs: Mapping[int, Sequence[float]] | None = None,
) -> dict[str, float]:
    """The step's final metrics: raw keys renamed (`metric_name`), then the derived numbers
    (train/clipfrac, train/entropy, timing_s/step, perf/*). Pure; the input is not changed."""
    out = {metric_name(k): float(v) for k, v in raw.items()}
    extra = logprob_metrics(trajs, trainer_logprobs or {})
    estimate = extra.pop("train/entropy_estimate", None)
    out.update(extra)
    if "train/entropy" not in out and estimate is not None:
        out["train/entropy"] = estimate
    if any(k in out for k in _CLIPFRACS):
        out["train/clipfrac"] = sum(out.get(k, 0.0) for k in _CLIPFRACS)
    phases = [v for k, v in out.items() if k.startswith("timing_s/") and k != "timing_s/step"]
    if phases:
        out["timing_s/step"] = sum(phases)
    sampled = out.get("rollout/sampled_tokens")
    if sampled is not None and out.get("timing_s/step"):
        out["perf/step_tokens_per_s"] = sampled / out["timing_s/step"]
    if out.get("timing_s/update") and trajs:
        processed = sum(
            len(t.token_ids)
            for t in trajs
            if not t.stop_reason.is_infra_failure and t.num_sampled > 0
        )
        out["perf/train_tokens_per_s"] = processed / out["timing_s/update"]
    return out


# a learner's counts and seconds per optimizer step: a trainer step's are their sums
SUMMED_OVER_STEPS = frozenset({"tokens", "loss_tokens", "batch_tokens", "micro_batches", "step_s",
                               "alloc_retries", "alloc_retries_optimizer"})  # fmt: skip


def mean_over_steps(steps: list[dict[str, float]]) -> dict[str, float]:
    """Metrics of several optimizer steps of one trainer step: the mean of each key; the max of
    `*_max`, the min of `*_min`, the sum of `*skipped` and of the counts and seconds
    (`SUMMED_OVER_STEPS`: with 2 mini-batches train/tokens read half the step's tokens)."""
    out: dict[str, float] = {}
    keys = {k for s in steps for k in s}
    for k in keys:
        xs = [s[k] for s in steps if k in s]
        if k.endswith("_max"):
            out[k] = max(xs)
        elif k.endswith("_min"):
            out[k] = min(xs)
        elif k.endswith("skipped") or k.rsplit("/", 1)[-1] in SUMMED_OVER_STEPS:
            out[k] = sum(xs)
        else:
            out[k] = sum(xs) / len(xs)
    return out


def gap_and_kl_metrics(
    ours: Mapping[int, torch.Tensor],
    trajs: Sequence[Trajectory],
    ref: Sequence[torch.Tensor] | None = None,
) -> dict[str, float]:
    """train/logprob_diff: mean |engine - trainer| logprob over the sampled tokens of the
    trajectories in `ours` (trainer logprobs before the update, by trajectory index);
    train/kl_ref: the k3 KL to the reference over the same tokens, when `ref` is given."""
    diff = kl = tokens = 0.0
    for i, lp in ours.items():
        m = torch.tensor(trajs[i].loss_mask, dtype=torch.bool)
        engine = torch.tensor(trajs[i].logprobs, dtype=torch.float32)
        diff += float((engine - lp).abs()[m].sum())
        tokens += float(m.sum())
        if ref is not None:
            kl += float(kl_estimate(lp, ref[i], "k3")[m].sum())
    out = {"train/logprob_diff": diff / max(tokens, 1.0)}
    if ref is not None:
        out["train/kl_ref"] = kl / max(tokens, 1.0)
    return out


REWARD_STATS = ("reward/mean", "reward/max", "reward/min", "reward/std")


def sampled_reward_metrics(groups: Sequence[Sequence[Trajectory]]) -> dict[str, float]:
    """reward/mean_all, max_all, min_all, std_all: the outcome reward over the scored episodes
    of every group sampled (dynamic sampling: those it dropped too); NaN when none was scored.
    env=mixture: env/<name>/reward_mean_all too, over each env's groups so."""

    def stats(gs: Sequence[Sequence[Trajectory]]) -> dict[str, float]:
        scored = [t for g in gs for t in g if not t.stop_reason.is_infra_failure]
        return reward_metrics(scored)

    every = stats(groups)
    out = {f"{k}_all": every.get(k, math.nan) for k in REWARD_STATS}
    for name, gs in by_env(groups).items():
        out[f"env/{name}/reward_mean_all"] = stats(gs).get("reward/mean", math.nan)
    return out


def by_env(groups: Sequence[Sequence[Trajectory]]) -> dict[str, list[Sequence[Trajectory]]]:
    """The groups of each env (`metadata["env"]`), in order; none for a single env's groups."""
    out: dict[str, list[Sequence[Trajectory]]] = {}
    for g in groups:
        if g and "env" in g[0].metadata:
            out.setdefault(g[0].metadata["env"], []).append(g)
    return out


def is_timing(name: str) -> bool:
    """Wall-clock and throughput metrics: timing_s/*, perf/*, and every name ending in `_s`,
    `_s_max`, `seconds` or `s_per_mb` (rollout/gen_latency_s, train/step_s, sync/seconds,
    eval/timing_s, …). They differ between any two runs; trainer.deterministic=true repeats every
    other metric exactly (tests/e2e/test_reproducible.py)."""
    leaf = name.rsplit("/", 1)[-1]
    return (
        name.startswith(("timing_s/", "perf/"))
        or leaf.endswith(("_s", "_s_max"))
        or leaf in ("seconds", "s_per_mb")
    )
