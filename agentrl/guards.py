"""Run health: what the trainer watches on every step, warns about, and stops on.

Counters, each with its stop or warning (`Limits`, from `trainer.guards.*`):
- crashed episodes (an exception in the env or its reward) above `max_aborted_frac` of a step:
  a bug, not noise; the run stops and shows one (`check_crashes`);
- steps with nothing to train on: skipped, and `max_empty_steps` in a row stop (`trainable`);
- steps where no group carries gradient (`carries`: every advantage 0): warned every
  `no_signal_steps` such steps in a row (`watch_signal`); dynamic sampling drops such groups
  (`keep`);
- optimizer steps with a non-finite loss or gradient: `max_skipped_steps` in a row stop the run,
  and `SKIP_SHARE` of the last `SKIP_WINDOW` (not in a row) are warned (`count_skip`);
- optimizer steps that learner.grad_clip scales down over 100x, or whose PPO clip holds most
  tokens: `STARVED_SHARE` of the last `SKIP_WINDOW` are warned once (`after_optimizer_step`).
And warnings: a tool failing on most of its calls (`metrics.ToolWatch`), per-turn rewards the
reward level ignores (once per run), sync turns sampled by other weights than the last push's,
the engine and the trainer disagreeing on logprobs (`warn_logprob_gap`; async: any staleness),
learner memory at its limit, tasks whose first prompt leaves no room for a turn (once per task),
a KL penalty in the reward (kl_mode=reward) that outweighs the reward's spread, and a rollout
correction (mis) that masks most tokens, each for `no_signal_steps` steps in a row. Every
warning goes to the log, the console and the tracker's alerts; its text comes from a pure
function of the step's trajectories (`crashed`, `off_version`, `ignored_turn_rewards`,
`prompt_overflows`) or of the update's metrics (agentrl/update_health.py).
"""

from __future__ import annotations

import collections
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from rich.console import Console
from rich.markup import escape

from agentrl.advantage import AdvantageConfig, Truncation, carries_gradient
from agentrl.batch import trainable
from agentrl.display import SHOWN
from agentrl.metrics import ToolWatch
from agentrl.types import TRUNCATED_STOPS, StopReason, TrainingError, Trajectory
from agentrl.update_health import (
    CLIP_SHRINKS,
    CLIPPED_MOST,
    clip_discards,
    clip_shrink,
    clip_starves,
    clipped_share,
    engine_gap,
    kl_drowns,
    memory_edge,
    mis_masks,
)

log = logging.getLogger(__name__)


# -- what each warning says (pure: trajectories and metrics in, text out) -------------------------


def crashed(tr: Trajectory) -> bool:
    """An episode whose env code raised: a reward error, an env error (its step raised), an
    agent error (an AgentEnv's agent raised), or an abort that carries a traceback
    (engine aborts and episode timeouts carry none: those are infrastructure)."""
    if tr.stop_reason.value in ("reward_error", "agent_error", "env_error"):
        return True
    return tr.stop_reason.value == "aborted" and "Traceback (most recent call last)" in (
        tr.error or ""
    )


def ignored_turn_rewards(trajs: Sequence[Trajectory], reward_level: str) -> str | None:
    """The warning to give when an env returns per-turn rewards that the config does not train
    on (algo.advantage.reward_level=trajectory); None otherwise."""
    if reward_level != "trajectory":
        return None
    n = sum(1 for t in trajs for turn in t.turns if turn.reward not in (None, 0.0))
    if not n:
        return None
    return (
        f"the env returned per-turn rewards (StepResult.reward, {n} non-zero turns this step) but "
        "algo.advantage.reward_level=trajectory trains on the outcome reward only, so they are "
        "ignored (reward/turn_sum shows them). Set algo.advantage.reward_level=turn to train on "
        "them, or fold them into the env's reward"
    )


def prompt_overflows(trajs: Sequence[Trajectory], known: set[str]) -> tuple[set[str], str | None]:
    """The tasks whose first prompt left no room for a turn (an episode that stopped with
    context_overflow before its first turn: `types.PromptOverflow`), and the warning to give for
    those not `known` yet (None: no new one). Every episode of such a task stops so, silently
    scored with nothing to train on."""
    over = [t for t in trajs if t.stop_reason is StopReason.CONTEXT_OVERFLOW and not t.turns]
    tasks = {t.task_id for t in over}
    new = sorted(tasks - known)
    if not new:
        return tasks, None
    first = next(t for t in over if t.task_id == new[0])
    names = ", ".join(repr(n) for n in new[:5]) + (", …" if len(new) > 5 else "")
    return tasks, (
        f"{len(new)} task(s) ({names}) cannot start: {first.error or 'no turn fits'}. "
        "Every episode of such a task stops before its first token (stop/context_overflow), "
        "with nothing to train on, and its reward still counts in reward/*. Raise "
        "rollout.max_context_tokens (and the servers' context length), or shorten or filter "
        "out these tasks' prompts. Said once per task"
    )


def off_version(trajs: list[Trajectory], want: str) -> tuple[int, str | None]:
    """Synchronous training: every turn was sampled with the weights the last push set (version
    `want`). The turns an engine says it sampled with other weights, and the warning to give
    (None when there are none; engines that report no version are not counted)."""
    off = [t.weight_version for tr in trajs for t in tr.turns if t.weight_version not in (want, "")]
    if not off:
        return 0, None
    seen = sorted(set(off))[:3]
    return len(off), (
        f"{len(off)} turns were sampled with weight version(s) {seen}, not the trainer's {want!r}: "
        "a weight push did not reach an engine, so it samples an old policy and the updates "
        "train on off-policy tokens. Check the sync/* metrics and the engine logs; a "
        "weight_sync transport of your own must pass weight_version to the engine's update call"
    )


# -- the guards -----------------------------------------------------------------------------------


# the endings that, on most episodes, explain a flat reward better than the model
ENDINGS = {
    StopReason.MAX_TURNS: "they run out of turns before they answer (a tool call's result "
    "comes back with no turn left to use it); raise rollout.max_turns",
    StopReason.PARSE_ERROR: "the model's tool calls do not parse (turns of malformed calls in a "
    "row); check rollout.parser against the model's chat template, and a trajectory with "
    "`agentrl preview`",
}


def no_signal_cause(
    groups: list[list[Trajectory]], cut: float, first_cut: float, had_signal: bool
) -> str:
    """What the no-signal warning adds when the step itself shows the cause (a red-team audit
    found it blaming the model for these): episodes truncated from the first step on, a policy
    that collapsed into the token limit after signal, most episodes out of turns or of parsable
    calls (`ENDINGS`), or groups of identical samples."""
    if cut >= 0.5 and first_cut >= 0.5:
        return (
            f". {cut:.0%} of the episodes are truncated (stop/length, stop/context_overflow), and "
            f"{first_cut:.0%} were at step 1: raise rollout.max_new_tokens or "
            "rollout.max_context_tokens"
        )
    if cut >= 0.5 and had_signal:  # a new user's learner.lr=5: collapsed at step 2
        return (
            f". This run had signal before, and now {cut:.0%} of the episodes run to the token "
            "limit (stop/length): the policy collapsed; check learner.lr, train/grad_norm and "
            "train/approx_kl"
        )
    trajs = [tr for g in groups for tr in g]
    for stop, fix in ENDINGS.items():
        share = sum(tr.stop_reason is stop for tr in trajs) / max(len(trajs), 1)
        if share >= 0.5:
            return f". {share:.0%} of the episodes end with stop/{stop.value}: {fix}"
    same = [
        g
        for g in groups
        if len(g) > 1 and len({tuple(t.token_ids[t.prompt_len :]) for t in g}) == 1
    ]
    if groups and len(same) == len(groups):
        return (
            ". Every group's samples are the same text: sampling is (nearly) greedy; raise "
            "rollout.temperature (about 1.0) and keep top_k=-1, top_p=1"
        )
    return ""


@dataclass(frozen=True)
class Limits:
    """The `trainer.guards.*` settings the guards apply (agentrl/trainer_config.py), and
    learner.grad_clip, which the updates' gradient norms are held against (0: no clipping)."""

    max_aborted_frac: float
    max_empty_steps: int
    no_signal_steps: int
    max_skipped_steps: int
    warn_logprob_gap: float
    warn_tool_fail_rate: float
    grad_clip: float = 0.0


# skipped optimizer steps that alternate with good ones never make `max_skipped_steps` in a
# row: up to half the updates could be dropped with only train/skipped to show it
SKIP_WINDOW, SKIP_SHARE = 10, 0.3
# in the same window, optimizer steps the gradient clip shrinks to almost nothing, or whose PPO
# clip holds most tokens: this share of them is a pattern, warned once per run
STARVED_SHARE = 0.5


@dataclass(frozen=True)
class Signal:
    """What makes a group's advantages non-zero in this run: the estimator and reward level,
    a KL penalty in the reward (kl_mode=reward), what truncated episodes get."""

    advantage: AdvantageConfig
    reward_penalty: bool = False
    truncation: Truncation = field(default_factory=Truncation)


class Guards:
    """The run's health counters and warnings (module docstring). `alert` sends a warning to the
    tracker (W&B alerts); `skipped_in_a_row` is a resumed run's count."""

    def __init__(
        self,
        limits: Limits,
        signal: Signal,
        console: Console,
        alert: Callable[[str, str], None],
        skipped_in_a_row: int = 0,
    ) -> None:
        self.limits, self.signal = limits, signal
        self.console, self.alert = console, alert
        self.skipped_in_a_row = skipped_in_a_row  # optimizer steps with a non-finite loss
        self.recent_skips: collections.deque[bool] = collections.deque(maxlen=SKIP_WINDOW)
        self.steps_since_skip_warning = SKIP_WINDOW
        self.clip_shrinks: dict[str, collections.deque[float]] = {  # per role: how many times
            role: collections.deque(maxlen=SKIP_WINDOW)  # grad_clip scaled each step down
            for role in ("policy", "critic")
        }
        self.clipped: collections.deque[float] = collections.deque(maxlen=SKIP_WINDOW)
        self.warned_updates: set[str] = set()  # the once-per-run update warnings given
        self.empty_in_a_row = 0  # steps with nothing to train on
        self.no_signal_in_a_row = 0  # steps where no group carried gradient
        self.one_reward_in_a_row = 0  # steps that carried gradient while every reward was one
        self.kl_heavy_in_a_row = 0  # steps whose KL reward penalty outweighed the rewards
        self.masked_in_a_row = 0  # steps whose rollout correction (mis) masked most tokens
        self.had_signal = False  # some step of this run carried gradient
        self.first_cut: float | None = None  # the first step's truncated share
        self.warned_turn_rewards = False  # per-turn rewards under reward_level=trajectory: once
        self.long_prompts: set[str] = set()  # tasks whose first prompt fits no turn: warned
        self.tool_watch = ToolWatch(limits.warn_tool_fail_rate)  # tools failing most calls

    def due(self, in_a_row: int) -> bool:
        """A streak's warning is due: every `no_signal_steps` steps of it (0: never)."""
        k = self.limits.no_signal_steps
        return bool(k and in_a_row and in_a_row % k == 0)

    def warn(self, title: str, msg: str) -> None:
        log.warning(msg, extra={SHOWN: True})  # the log file has it; the terminal shows it once
        self.console.print(f"[bold red]warning:[/] {escape(msg)}")  # tool text is no markup
        self.alert(title, msg)

    # -- after the rollout ---------------------------------------------------------------------

    def check_crashes(self, trajs: list[Trajectory], step: int) -> None:
        """Episodes that crashed (an exception in the env or its reward) are not infrastructure
        noise past `max_aborted_frac` of a step: stop and show one of them."""
        failed = [tr for tr in trajs if crashed(tr)]
        bar = self.limits.max_aborted_frac
        if trajs and len(failed) / len(trajs) > bar:
            first = failed[0]
            raise TrainingError(
                f"{len(failed)} of {len(trajs)} episodes of step {step} crashed "
                f"(stop reasons {sorted({tr.stop_reason.value for tr in failed})}), above "
                f"trainer.guards.max_aborted_frac={bar:g}. This is a bug "
                f"in the env, its tools or its reward, not noise. First one (task "
                f"{first.task_id!r}, sample {first.sample_index}):\n{first.error}"
            )

    def after_rollout(
        self, groups: list[list[Trajectory]], trajs: list[Trajectory], metrics: dict[str, float],
        step: int, sync: bool,
    ) -> None:  # fmt: skip
        """The step's groups as taken: failing tools, first prompts that fit no turn, old
        weights (`sync` only: in async mode tokens are older by design), no learning signal."""
        self.watch_tools(trajs, metrics, step)
        self.watch_prompts(trajs)
        if sync:  # every turn must come from the weights just pushed
            self.watch_versions(trajs, metrics, step)
        self.watch_signal(groups, metrics)

    def watch_tools(self, trajs: list[Trajectory], metrics: dict[str, float], step: int) -> None:
        """A tool failing on most of its calls: warned at once, then every few steps while it
        lasts (`metrics.ToolWatch` says when); a note when it recovers."""
        out, warnings, notes = self.tool_watch.update(trajs, step)
        metrics.update(out)
        for msg in warnings:
            self.warn("tool failing", msg)
        for msg in notes:
            self.console.print(escape(msg), style="yellow")

    def watch_versions(self, trajs: list[Trajectory], metrics: dict[str, float], step: int) -> None:
        """Sync mode: every turn must come from the weights pushed after step `step - 1`."""
        metrics["rollout/off_version_turns"], msg = off_version(trajs, str(step - 1))
        if msg:
            self.warn("engine serves old weights", msg)

    def carries(self, group: list[Trajectory]) -> bool:
        """Whether the group's advantages can be non-zero under this run's estimator, reward
        level and KL mode (`advantage.carries_gradient` states the rule)."""
        s = self.signal
        return carries_gradient(
            group, s.advantage, reward_penalty=s.reward_penalty, truncation=s.truncation
        )

    def keep(self, group: list[Trajectory]) -> bool:
        """Dynamic sampling's test (`carries`), sync and async. A group it drops is first looked
        at for per-turn rewards that reward_level=trajectory ignores: such a group is flat there,
        so `watch_signal`, which sees only the kept groups, would never warn about them; so is
        a group of a task whose first prompt does not fit."""
        self.warn_ignored_turn_rewards(group)
        self.watch_prompts(group)
        return self.carries(group)

    def watch_prompts(self, trajs: list[Trajectory]) -> None:
        """Once per task: a first prompt that leaves no room for a turn (`prompt_overflows`)."""
        tasks, msg = prompt_overflows(trajs, self.long_prompts)
        self.long_prompts |= tasks
        if msg:
            self.warn("prompt longer than the context", msg)

    def warn_ignored_turn_rewards(self, trajs: list[Trajectory]) -> None:
        """Once per run: per-turn rewards the reward level ignores."""
        level = self.signal.advantage.reward_level
        if not self.warned_turn_rewards and (msg := ignored_turn_rewards(trajs, level)):
            self.warned_turn_rewards = True
            self.warn("per-turn rewards ignored", msg)

    def watch_signal(self, groups: list[list[Trajectory]], metrics: dict[str, float]) -> None:
        """Say so, loudly, when no group carries gradient (`carries`) for `no_signal_steps`
        steps in a row: every advantage is 0 and the policy gradient is exactly zero. And once
        per run: per-turn rewards the reward level ignores."""
        trajs = [tr for g in groups for tr in g]
        self.warn_ignored_turn_rewards(trajs)
        flat = not any(self.carries(g) for g in groups)
        cut = sum(tr.stop_reason in TRUNCATED_STOPS for tr in trajs) / max(len(trajs), 1)
        self.first_cut = cut if self.first_cut is None else self.first_cut
        self.had_signal = self.had_signal or not flat
        self.no_signal_in_a_row = self.no_signal_in_a_row + 1 if flat else 0
        metrics["train/no_signal_steps_in_a_row"] = float(self.no_signal_in_a_row)
        if self.due(self.no_signal_in_a_row):
            rewards = sorted({tr.reward for g in groups for tr in g})[:5]
            msg = (
                f"no learning signal for {self.no_signal_in_a_row} steps: in every group the "
                f"rewards (outcome values seen: {rewards}; per-turn ones at reward_level=turn) "
                "are equal, so every advantage is 0. Likely causes: the "
                "model never calls the tools or never succeeds (reward always 0: check "
                "rollout/tool_call_rate, stop/*, a trajectory with `agentrl preview`, "
                "the parser and the reward function), the task is too easy (always 1), or "
                "rollout.group_size is 1"
            )
            msg += no_signal_cause(groups, cut, self.first_cut, self.had_signal)
            self.warn("no learning signal", msg)
        self.watch_one_reward(trajs, flat)

    def watch_one_reward(self, trajs: list[Trajectory], flat: bool) -> None:
        """A critic (ppo) or kl_mode=reward gives advantages whatever the rewards are, so
        `carries` says yes, and the no-signal warning stayed silent over runs whose every reward
        was the same (a red-team audit: PPO on an all-0 reward updated on the critic's noise;
        a constant reward under kl_mode=reward stayed at the reference). Warned every
        `no_signal_steps` such steps in a row."""
        valid = [t for t in trajs if not t.stop_reason.is_infra_failure]
        seen = {(t.reward, tuple(turn.reward or 0.0 for turn in t.turns)) for t in valid}
        one = not flat and len(valid) > 1 and len(seen) == 1
        self.one_reward_in_a_row = self.one_reward_in_a_row + 1 if one else 0
        if self.due(self.one_reward_in_a_row):
            self.warn(
                "one reward for every episode",
                f"every episode of the last {self.one_reward_in_a_row} steps got the same reward "
                f"({valid[0].reward:g}): nothing the policy does changes it, and the update "
                "follows only the critic's values (algo=ppo) or the KL term (kl_mode=reward). "
                "Check the reward function and a trajectory with `agentrl preview`",
            )

    def trainable(self, trajs: list[Trajectory], metrics: dict[str, float], step: int) -> bool:
        """False (the step is skipped and counted) when no trajectory has a token to train on;
        `max_empty_steps` such steps in a row stop the run."""
        ok = any(trainable(tr, self.signal.truncation) for tr in trajs)
        self.empty_in_a_row = 0 if ok else self.empty_in_a_row + 1
        metrics["train/empty_steps_in_a_row"] = float(self.empty_in_a_row)
        if not ok:
            reasons = sorted({tr.stop_reason.value for tr in trajs})
            self.console.print(
                f"[yellow]step {step}: no trajectory to train on (stop reasons "
                f"{reasons}); skipped[/]"
            )
        if self.empty_in_a_row >= self.limits.max_empty_steps:
            raise TrainingError(
                f"{self.empty_in_a_row} steps in a row had no trajectory to train on (all "
                "infrastructure failures, no sampled token, or truncated under "
                f"rollout.truncated=mask; stop reasons {reasons}). Check "
                "the engine and sandbox logs in the run's output dir (truncated: raise "
                "rollout.max_new_tokens / max_context_tokens)"
            )
        return ok

    # -- after the update ----------------------------------------------------------------------

    def after_optimizer_step(self, out: dict[str, float]) -> None:
        """One optimizer step's metrics (`<role>/*`): non-finite steps (`count_skip`); and, once
        per run each, updates that learner.grad_clip scales down more than CLIP_SHRINKS times
        (policy or critic) or whose PPO clip holds more than CLIPPED_MOST of the tokens, in
        STARVED_SHARE of the last SKIP_WINDOW optimizer steps: a run that looks healthy and
        learns (almost) nothing."""
        self.count_skip(out)
        clip = self.limits.grad_clip
        for role, shrinks in self.clip_shrinks.items():
            if f"{role}/grad_norm" in out:
                shrinks.append(clip_shrink(out, role, clip))
            if self.starved(f"{role} clip", [s > CLIP_SHRINKS for s in shrinks]):
                self.warn("updates shrunk by grad_clip", clip_starves(role, clip, shrinks))
        if (share := clipped_share(out)) is not None:
            self.clipped.append(share)
        if self.starved("ppo clip", [s > CLIPPED_MOST for s in self.clipped]):
            self.warn("PPO clip discards most tokens", clip_discards(self.clipped))

    def starved(self, name: str, recent: list[bool]) -> bool:
        """Whether the update warning `name` is due: not given yet, and true of STARVED_SHARE
        of the last SKIP_WINDOW optimizer steps (`recent`)."""
        if name in self.warned_updates or sum(recent) < STARVED_SHARE * SKIP_WINDOW:
            return False
        self.warned_updates.add(name)
        return True

    def count_skip(self, out: dict[str, float]) -> None:
        """One optimizer step's metrics: `max_skipped_steps` non-finite ones in a row stop."""
        skipped = out.get("policy/skipped", 0.0) > 0 or out.get("critic/skipped", 0.0) > 0
        self.skipped_in_a_row = self.skipped_in_a_row + 1 if skipped else 0
        self.recent_skips.append(skipped)
        self.steps_since_skip_warning += 1
        many = sum(self.recent_skips)
        if many >= SKIP_SHARE * SKIP_WINDOW and self.steps_since_skip_warning >= SKIP_WINDOW:
            self.steps_since_skip_warning = 0
            self.warn(
                "optimizer steps skipped",
                f"{many} of the last {len(self.recent_skips)} optimizer steps had a non-finite "
                "loss or gradient and were skipped (not in a row, so the run goes on): their "
                "batches trained nothing. Lower learner.lr or tighten learner.grad_clip, and "
                "check the rewards and the engine/trainer logprob gap for inf/NaN",
            )
        if self.skipped_in_a_row >= self.limits.max_skipped_steps:
            raise TrainingError(
                f"{self.skipped_in_a_row} optimizer steps in a row had a non-finite loss or "
                f"gradient (last grad_norm={out.get('policy/grad_norm')}); the run diverged. "
                "Lower learner.lr, check rewards for NaN, then resume with checkpoint.resume=auto"
            )

    def watch_update(self, metrics: dict[str, float], step: int, stale: bool) -> None:
        """Learner memory at its limit; the engine's logprobs far from the trainer's (`stale`,
        async: any gap, the weights moved on since the tokens were sampled); a KL reward
        penalty that outweighs the rewards, and a rollout correction that masks most tokens,
        every `no_signal_steps` such steps in a row."""
        if edge := memory_edge(metrics):
            self.warn("learner memory at its limit", edge)
        bar = 0 if stale else self.limits.warn_logprob_gap
        if gap := engine_gap(metrics, bar, step):
            self.warn("engine and trainer disagree", gap)
        heavy = kl_drowns(metrics)
        self.kl_heavy_in_a_row = self.kl_heavy_in_a_row + 1 if heavy else 0
        if heavy and self.due(self.kl_heavy_in_a_row):
            self.warn(
                "KL outweighs the reward", f"{self.kl_heavy_in_a_row} steps in a row: {heavy}"
            )
        masked = mis_masks(metrics)
        self.masked_in_a_row = self.masked_in_a_row + 1 if masked else 0
        if masked and self.due(self.masked_in_a_row):
            self.warn("rollout correction masks most tokens",
                      f"{self.masked_in_a_row} steps in a row: {masked}")  # fmt: skip
