"""The RL loop (`agentrl train env=code_exec …`, or `python -m agentrl.train …`). Its choices:

1. Batch: every trajectory with a sampled token, except infrastructure failures (aborted by the
   system, sandbox_unavailable: out of the batch AND of the group baselines, counted).
2. Ratio: new / the trainer's own logprobs from before this step's first update (ratio=trainer);
   the engine's logprobs only weight it through TIS/MIS (rollout_correction), never the clip.
3. KL to a frozen reference: off by default; kl_mode=loss (k3 in the loss) or kl_mode=reward
   (per-token penalty subtracted before the advantages).
4. Advantages: per group from rewards (grpo, rloo, drgrpo, …) or a critic (gae); a step where
   no group carries gradient (`advantage.carries_gradient`: every advantage 0) is loudly
   reported after `trainer.no_signal_steps` such steps; dynamic sampling drops such groups.
5. Optimizer steps per batch: ppo_epochs x mini_batches (default 1 x 1, the on-policy case).
6. Weights go to the engines after the last optimizer step; every token records its version.

Per step: sample tasks → rollout groups → score the sampled tokens with the current weights →
advantages → update (FSDP2 on Ray) → weight sync → log → checkpoint. `Trainer.step` is the whole
algorithm; `agentrl.run.open_run` builds the parts (Ray on loopback, learner groups, rollout
servers, sandbox, weight sync, resume) and closes them in reverse, also after errors.

In more detail, in the order they happen:
- What is trained on: every trajectory with at least one sampled token whose StopReason is not an
  infrastructure failure (aborted, sandbox_unavailable: left out of the batch and of the group
  baselines, counted as stop/<reason>). Episodes whose env or reward code raised count against
  `trainer.max_aborted_frac`; above it the run stops and shows one traceback. A step with nothing
  to train on is skipped (`trainer.max_empty_steps` in a row stop the run): the engines keep
  their weights under the next version, in both modes (`_relabel`).
- Old logprobs (`trainer_old_logprobs`): the policy's logprobs of the sampled tokens before any
  update; a pass of their own, or with one optimizer step per batch that step's own forward
  (`algo.old_logprobs=auto`). With `algo.loss.ratio=trainer` they are the ratio's denominator;
  the engine's logprobs enter through the rollout correction (`algo.loss.rollout_correction`).
- Reference and critic: with a reference model (`algo.reference`, or kl_coef > 0) its logprobs
  are computed in the same pass; KL goes into the loss (kl_mode=loss, k2/k3/k3+) or is subtracted
  from the reward per token before the advantages (kl_mode=reward). With a critic (algo=ppo: gae)
  its values are computed in the same pass, before the update.
- Advantages: per group, from the rewards (and values), `algo.advantage`.
- Optimizer steps per batch: `algo.ppo_epochs` passes, each split into `algo.mini_batches` steps of
  whole sequences (shuffled per epoch, each with its own loss normaliser); default 1 x 1, one
  step per batch. The critic takes a step on each same mini-batch.
- The new weights go to the engines after the last optimizer step; every completion records the
  weight version it was sampled with.
- Evaluation (`trainer.eval_every`): a fixed task set rolled out before the first step and after
  every N-th and the last, never trained on (agentrl/evaluate.py; `eval/*` in the step's metrics,
  and a step-0 row of its own for the untrained policy).
"""

from __future__ import annotations

import asyncio
import logging
import math
import random
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import hydra
import torch
from hydra.core.hydra_config import HydraConfig
from rich.console import Console
from rich.markup import escape

from agentrl.advantage import Truncation, carries_gradient, compute_advantages
from agentrl.batch import TrainBatch, mini_batches, per_trajectory, trainable
from agentrl.ckpt import CheckpointManager, load_trainer_state
from agentrl.config import (
    CONFIG_DIR,
    Config,
    check_command_line,
    errors_for_people,
    load_config,
)
from agentrl.data import TaskSampler
from agentrl.display import ProgressLine, eval_text, trajectory_panel
from agentrl.engine import EngineClient, EngineUnavailable, Fleet
from agentrl.evaluate import evaluate
from agentrl.learner.group import LearnerGroup
from agentrl.loss import kl_reward_penalty
from agentrl.metrics import (
    ToolWatch,
    crashed,
    engine_gap,
    gap_and_kl_metrics,
    ignored_turn_rewards,
    mean_over_steps,
    mean_reward,
    memory_edge,
    off_version,
    rollout_metrics,
    step_metrics,
)
from agentrl.mixture import MixtureRollout, MixtureSampler
from agentrl.producer import GroupProducer, producing
from agentrl.recovery import EngineRecovery, TrainingError
from agentrl.rollout import Rollout
from agentrl.run import (
    PendingCheckpoint,
    Run,
    finish_checkpoint,
    open_run,
    prepare_checkpoints,
    resume_point,
    save_checkpoint,
)
from agentrl.runlock import refuse_if_held
from agentrl.seeding import sampling_round
from agentrl.tracking import Tracker
from agentrl.trajectory_view import pick
from agentrl.types import Task, Trajectory
from agentrl.weight_sync import Transport

log = logging.getLogger(__name__)


def _tasks_of(groups: list[list[Trajectory]], launched: list[Task]) -> list[Task]:
    """The task of each kept group (groups come back in launch order, a subset when
    over-sampling)."""
    by_id: dict[str, list[Task]] = {}
    for t in launched:
        by_id.setdefault(t.id, []).append(t)
    return [by_id[g[0].task_id].pop(0) for g in groups]


class Timer:
    def __init__(self) -> None:
        self.times: dict[str, float] = {}

    @contextmanager
    def __call__(self, phase: str):
        t0 = time.monotonic()
        try:
            yield
        finally:
            self.times[f"timing_s/{phase}"] = time.monotonic() - t0


class Trainer(EngineRecovery):
    """The loop over the parts of a `Run` (agentrl/run.py builds and closes them)."""

    def __init__(self, cfg: Config, run: Run) -> None:
        if run.policy is None or run.sync is None or run.tracker is None or run.ckpt is None:
            raise ValueError("Trainer needs a training run: open_run(cfg, out, train=True)")
        self.cfg, self.parts, self.out = cfg, run, run.out
        self.console: Console = run.console
        self.sampler: TaskSampler | MixtureSampler = run.sampler
        self.rollout: Rollout | MixtureRollout = run.rollout
        self.engine: EngineClient = run.engine
        self.fleet: Fleet | None = run.fleet  # servers we started and may restart
        self.policy: LearnerGroup = run.policy
        self.reference: LearnerGroup | None = run.reference  # frozen, when the algorithm uses one
        self.critic: LearnerGroup | None = run.critic  # when the estimator needs values (gae)
        self.sync: Transport = run.sync
        self.ckpt: CheckpointManager = run.ckpt
        self.tracker: Tracker = run.tracker
        self.progress: ProgressLine | None = run.progress
        resumed = run.resumed
        self.step_idx = resumed.step if resumed else 0
        self.skipped_in_a_row = resumed.consecutive_skips if resumed else 0
        self.empty_in_a_row = 0  # steps with nothing to train on
        self.sandbox_restarts = 0  # the sandbox client's restarts counted so far (recovery.py)
        self.no_signal_in_a_row = 0  # steps where no group carried gradient
        self.warned_turn_rewards = False  # per-turn rewards under reward_level=trajectory: once
        self.tool_watch = ToolWatch(cfg.trainer.warn_tool_fail_rate)  # tools failing most calls
        self.history: list[dict[str, float]] = []
        self.trainer_logprobs: dict[int, torch.Tensor] = {}  # this step's, by trajectory index
        self.producer: GroupProducer | None = None  # trainer.mode=async: rollouts run ahead
        self.saving: PendingCheckpoint | None = None  # trainer.async_save: files being written
        self.eval_tasks = run.eval_tasks  # trainer.eval_every: the fixed set (agentrl/evaluate.py)
        # trainer.deterministic: each round's requests are seeded by their place (seeding.py)
        self.sampling_seed = cfg.seed if cfg.trainer.deterministic else None
        # rollout.truncated: what advantages and the batch do with a length-truncated episode
        self.truncation = Truncation(cfg.rollout.truncated, cfg.rollout.truncated_reward)

    # -- the algorithm -------------------------------------------------------------------------

    async def step(self) -> dict[str, float]:
        cfg, t = self.cfg, Timer()
        with t("rollout"), sampling_round(self.sampling_seed, f"step {self.step_idx + 1}"):
            # async: the time the learner waited for finished groups
            collect = self._collect_async if self.producer is not None else self._collect
            groups, recovery = await collect()
            trajs = [tr for g in groups for tr in g]
            self._check_failures(trajs)
        metrics = rollout_metrics(trajs, self.truncation)
        if isinstance(self.rollout, MixtureRollout):  # env=mixture: env/<name>/* beside them
            metrics.update(self.rollout.env_metrics(groups, self.truncation))
        metrics.update(recovery)
        self._watch_tools(trajs, metrics)
        if self.producer is None:  # sync: every turn must come from the weights just pushed
            metrics["rollout/off_version_turns"], msg = off_version(trajs, str(self.step_idx))
            if msg:
                self._warn("engine serves old weights", msg)
        self._watch_signal(groups, metrics)
        self.trainer_logprobs = {}
        if not self._any_trainable(trajs, metrics):  # skipped: the weights stay as they are
            with t("sync"):
                await self._relabel(version=str(self.step_idx + 1))
            self.step_idx += 1
            if self.producer is not None:  # async: the next groups may launch (none hangs)
                self.producer.advance(self.step_idx)
            with t("checkpoint"):
                self._commit_saved(wait=False)
                if self.ckpt.should_save(self.step_idx, cfg.trainer.steps):
                    self._save()
            metrics.update(t.times, step=float(self.step_idx))
            metrics.update(await self._evaluate_if_due())
            self._log(metrics, trajs)
            return metrics
        # Score the sampled tokens with the weights about to be trained (_score says with what);
        # truncated episodes under rollout.truncated=mask too: their KL penalty is in their score
        scoring = TrainBatch.from_trajectories(trajs, None)
        per_rank = self.policy.micro_batches(scoring)
        with t("to_learner"):
            await self._hand_gpu(to_learner=True)
        with t("logprobs"):
            scores = await self._blocking(self._score, per_rank, trajs, metrics)
        with t("advantage"):
            adv = compute_advantages(
                groups,
                cfg.algo.advantage,
                scores.get("values"),
                scores.get("penalties"),
                self.truncation,
            )
            batch = TrainBatch.from_trajectories(
                trajs,
                adv.advantages,
                self.truncation,
                trainer_old_logprobs=scores.get("trainer_old_logprobs"),
                ref_logprobs=scores.get("ref_logprobs"),
                values=scores.get("values"),
                returns=adv.returns,
            )
        metrics.update(adv.metrics)
        with t("update"):
            ref = scores.get("ref_logprobs")
            metrics.update(await self._blocking(self._update, batch, trajs, ref))
        if edge := memory_edge(metrics):
            self._warn("learner memory at its limit", edge)
        bar = cfg.trainer.warn_logprob_gap if self.producer is None else 0  # async: staleness
        if gap := engine_gap(metrics, bar, self.step_idx + 1):
            self._warn("engine and trainer disagree", gap)
        with t("sync"):
            metrics["engine/restarts"] += await self._revive_before_push()
            metrics.update(await self._sync(version=str(self.step_idx + 1)))
        metrics.update(self._peak_memory())
        self.step_idx += 1
        if self.producer is not None:
            self.producer.advance(self.step_idx)
        with t("checkpoint"):  # what blocks: async_save writes the files behind later steps
            self._commit_saved(wait=False)
            if self.ckpt.should_save(self.step_idx, cfg.trainer.steps):
                self._save()
        metrics.update(t.times, step=float(self.step_idx))
        metrics["perf/sampled_tokens_per_s"] = metrics["rollout/sampled_tokens"] / max(
            t.times["timing_s/rollout"], 1e-9
        )
        metrics.update(await self._evaluate_if_due())  # its time is eval/timing_s, not the step's
        self._log(metrics, trajs)
        return metrics

    async def _collect(self) -> tuple[list[list[Trajectory]], dict[str, float]]:
        """trainer.mode=sync: roll out this step's groups now (over-sampled, first to finish)."""
        tc = self.cfg.trainer
        want = tc.tasks_per_step
        launched = self.sampler.next(want + tc.oversample_groups)
        groups = await self.rollout.run(launched, keep=want)
        tasks = _tasks_of(groups, launched)
        groups, recovery = await self._recover_engines(tasks, groups)
        recovery["rollout/oversampled_dropped"] = float(len(launched) - len(groups))
        if tc.dynamic_sampling:
            groups, refill = await self._refill(groups, want, tc.max_refill_rounds)
            recovery.update(refill)
        return groups, recovery

    async def _refill(
        self, groups: list[list[Trajectory]], want: int, max_rounds: int
    ) -> tuple[list[list[Trajectory]], dict[str, float]]:
        """Dynamic sampling (sync): keep the groups that carry gradient (`_keep`), roll out
        more tasks until `want` do or `max_rounds` extra rounds are spent. With none at all, the
        step keeps what it had (the no-signal warning then counts it). reward/mean_all: over
        every group rolled out, the filtered ones too."""
        seen = list(groups)
        kept = [g for g in groups if self._keep(g)]
        filtered, rounds = len(groups) - len(kept), 0
        while len(kept) < want and rounds < max_rounds:
            tasks = self.sampler.next(want - len(kept))
            more, _ = await self._recover_engines(tasks, await self.rollout.run(tasks))
            good = [g for g in more if self._keep(g)]
            seen += more
            kept += good
            filtered += len(more) - len(good)
            rounds += 1
        return (kept or groups), {
            "rollout/filtered_groups": float(filtered),
            "rollout/refill_rounds": float(rounds),
            "reward/mean_all": mean_reward(seen),
        }

    def _keep(self, group: list[Trajectory]) -> bool:
        """Dynamic sampling's test (`_carries`), sync and async. A group it drops is first looked
        at for per-turn rewards that reward_level=trajectory ignores: such a group is flat there,
        so `_watch_signal`, which sees only the kept groups, would never warn about them."""
        self._warn_ignored_turn_rewards(group)
        return self._carries(group)

    def _carries(self, group: list[Trajectory]) -> bool:
        """Whether the group's advantages can be non-zero under this run's estimator, reward
        level and KL mode (`advantage.carries_gradient` states the rule)."""
        algo = self.cfg.algo
        return carries_gradient(
            group, algo.advantage, reward_penalty=algo.kl_in_reward(), truncation=self.truncation
        )

    async def _collect_async(self) -> tuple[list[list[Trajectory]], dict[str, float]]:
        """trainer.mode=async: the next finished groups within the staleness bound."""
        assert self.producer is not None
        taken, metrics = await self.producer.take(self.cfg.trainer.tasks_per_step)
        groups = [g.trajectories for g in taken]
        groups, recovery = await self._recover_engines([g.task for g in taken], groups)
        return groups, {**metrics, **recovery, "rollout/oversampled_dropped": 0.0}

    async def _blocking(self, fn, *args):
        """The learner's blocking calls (Ray round trips): in async mode off the event loop, so
        the rollouts it drives keep going meanwhile."""
        if self.producer is None:
            return fn(*args)
        return await asyncio.to_thread(fn, *args)

    def _score(
        self, per_rank: list[list[TrainBatch]], trajs: list[Trajectory], metrics: dict[str, float]
    ) -> dict[str, list[torch.Tensor]]:
        """Per trajectory (aligned with its token_ids; zeros for trajectories left out of the
        batch): the trainer's logprobs before the update (unless the update's own forward gives
        them: algo.old_logprobs), the reference's, the critic's values, and the KL reward
        penalty (kl_mode=reward). Metrics: train/logprob_diff, train/kl_ref (before the update)."""
        cfg, out_per_mb = self.cfg, {}
        temp = cfg.rollout.temperature
        if not cfg.algo.old_logprobs_from_update():
            out_per_mb["trainer_old_logprobs"] = self.policy.compute_logprobs(per_rank, temp)
        if self.reference is not None:
            out_per_mb["ref_logprobs"] = self.reference.compute_logprobs(per_rank, temp)
        if self.critic is not None:
            out_per_mb["values"] = self.critic.compute_values(per_rank)
        lengths = [len(tr.token_ids) for tr in trajs]
        scores = {k: per_trajectory(per_rank, v, lengths) for k, v in out_per_mb.items()}
        if "trainer_old_logprobs" in scores:
            ours, ref = scores["trainer_old_logprobs"], scores.get("ref_logprobs")
            metrics.update(self._record_trainer_logprobs(per_rank, ours, trajs, ref))
        loss = cfg.algo.loss
        if cfg.algo.kl_in_reward():
            masks = [torch.tensor(tr.loss_mask, dtype=torch.bool) for tr in trajs]
            scores["penalties"] = [
                kl_reward_penalty(lp, ref, m, loss.kl_coef, loss.kl_kind)
                for lp, ref, m in zip(
                    scores["trainer_old_logprobs"], scores["ref_logprobs"], masks, strict=True
                )
            ]
            metrics["train/kl_reward_penalty"] = float(
                sum(float(p.sum()) for p in scores["penalties"])
            ) / max(len(self.trainer_logprobs), 1)
        return scores

    def _record_trainer_logprobs(
        self,
        per_rank: list[list[TrainBatch]],
        ours: list[torch.Tensor],
        trajs: list[Trajectory],
        ref: list[torch.Tensor] | None,
    ) -> dict[str, float]:
        """Keep this step's pi_old per trajectory (logged with it); their gap and KL metrics."""
        kept = sorted({src for mbs in per_rank for mb in mbs for src in mb.source})
        self.trainer_logprobs = {i: ours[i] for i in kept}
        return gap_and_kl_metrics(self.trainer_logprobs, trajs, ref)

    async def _hand_gpu(self, to_learner: bool) -> None:
        """Colocated mode: the engine frees its GPU memory for the update, the learner moves
        its state back onto the GPU (and the reverse after the sync). A no-op otherwise."""
        if not self.cfg.engine.colocate:
            return
        if to_learner:
            await self.engine.release_memory_occupation()
            for g in self._learners():
                g.onload()
        else:
            for g in self._learners():
                g.offload()
            await self.engine.resume_memory_occupation(["kv_cache", "cuda_graph"])

    def _learners(self) -> list[LearnerGroup]:
        return [g for g in (self.policy, self.reference, self.critic) if g is not None]

    async def _sync(self, version: str) -> dict[str, float]:
        if self.cfg.engine.colocate:  # weights first, so the learner's tensors can land there
            await self.engine.resume_memory_occupation(["weights"])
        # async: the turns in flight are cut and go on after the push (trainer.partial_rollouts)
        # or finish first; new ones wait. Sync: nothing is in flight.
        cut = self.producer is not None and self.cfg.trainer.partial_rollouts
        t0 = time.perf_counter()
        async with self.engine.exclusive(pause=cut) as inflight:
            waited = time.perf_counter() - t0
            out = await self.sync.push(version=version)
        out["sync/drain_s"] = waited
        out["sync/cut_turns"] = float(inflight if cut else 0)
        await self._hand_gpu(to_learner=False)
        return out

    async def _relabel(self, version: str) -> None:
        """A skipped step: the engines keep their weights (the step changed none) and say
        `version`, as a push would, so versions keep counting steps in both modes: sync's check
        that every turn comes from the last step's weights holds, async's launch budget
        (agentrl/producer.py) moves on, and a token's staleness counts at least the updates
        since it was sampled. Nothing is cut: the turns in flight sampled the same weights. A
        server that does not answer is restarted by the next rollout's recovery, which pushes
        it this version."""
        try:
            await self.engine.update_weight_version(version, abort_all_requests=False)
        except EngineUnavailable as e:
            log.warning("weight version %s did not reach every server: %s", version, e)

    def _peak_memory(self) -> dict[str, float]:
        """perf/peak_mem_gb/<phase>: the learners' own GPU allocations at most, this step (the
        engine's memory is the server's; `ref_`/`critic_` prefix the other roles)."""
        out = {}
        roles = {"": self.policy, "ref_": self.reference, "critic_": self.critic}
        for prefix, group in roles.items():
            if group is not None:
                for phase, gib in group.peak_memory().items():
                    out[f"perf/peak_mem_gb/{prefix}{phase}"] = gib
        return out

    def _update(
        self, batch: TrainBatch, trajs: list[Trajectory], ref: list[torch.Tensor] | None
    ) -> dict[str, float]:
        """`algo.ppo_epochs` passes over the batch, each split into `algo.mini_batches`
        optimizer steps (shuffled per epoch). Every step's ratio uses the same denominator: the
        trainer's logprobs from before the first step (or the engine's with ratio=engine)."""
        cfg, algo = self.cfg, self.cfg.algo
        steps: list[dict[str, float]] = []
        for epoch in range(algo.ppo_epochs):
            seed = self.cfg.seed * 1_000_003 + self.step_idx * 1009 + epoch
            for mini in mini_batches(batch, algo.mini_batches, seed):
                per_rank = self.policy.micro_batches(mini)
                from_update = algo.old_logprobs_from_update()
                out = self.policy.train_step(
                    per_rank, algo.loss.name, algo.loss, cfg.rollout.temperature, from_update
                )
                if from_update:  # pi_old came from this (only) step's forward: record it now
                    lengths = [len(tr.token_ids) for tr in trajs]
                    ours = per_trajectory(per_rank, self.policy.update_logprobs(), lengths)
                    out.update(self._record_trainer_logprobs(per_rank, ours, trajs, ref))
                if self.critic is not None:
                    out.update(self.critic.train_step(per_rank, "value_clip", algo.loss))
                steps.append(out)
                self._count_skip(out)
        out = mean_over_steps(steps)
        out["train/optimizer_steps"] = float(len(steps))
        out["train/skipped_steps_in_a_row"] = float(self.skipped_in_a_row)
        return out

    def _count_skip(self, out: dict[str, float]) -> None:
        skipped = out.get("policy/skipped", 0.0) > 0 or out.get("critic/skipped", 0.0) > 0
        self.skipped_in_a_row = self.skipped_in_a_row + 1 if skipped else 0
        if self.skipped_in_a_row >= self.cfg.trainer.max_skipped_steps:
            raise TrainingError(
                f"{self.skipped_in_a_row} optimizer steps in a row had a non-finite loss or "
                f"gradient (last grad_norm={out.get('policy/grad_norm')}); the run diverged. "
                "Lower learner.lr, check rewards for NaN, then resume with trainer.resume=auto"
            )

    # -- failures and signal -------------------------------------------------------------------

    def _check_failures(self, trajs: list[Trajectory]) -> None:
        """Episodes that crashed (an exception in the env or its reward) are not infrastructure
        noise past `trainer.max_aborted_frac` of a step: stop and show one of them."""
        failed = [tr for tr in trajs if crashed(tr)]
        if trajs and len(failed) / len(trajs) > self.cfg.trainer.max_aborted_frac:
            first = failed[0]
            raise TrainingError(
                f"{len(failed)} of {len(trajs)} episodes of step {self.step_idx + 1} crashed "
                f"(stop reasons {sorted({tr.stop_reason.value for tr in failed})}), above "
                f"trainer.max_aborted_frac={self.cfg.trainer.max_aborted_frac:g}. This is a bug "
                f"in the env, its tools or its reward, not noise. First one (task "
                f"{first.task_id!r}, sample {first.sample_index}):\n{first.error}"
            )

    def _any_trainable(self, trajs: list[Trajectory], metrics: dict[str, float]) -> bool:
        """False (the step is skipped and counted) when no trajectory has a token to train on;
        `trainer.max_empty_steps` such steps in a row stop the run."""
        ok = any(trainable(tr, self.truncation) for tr in trajs)
        self.empty_in_a_row = 0 if ok else self.empty_in_a_row + 1
        metrics["train/empty_steps_in_a_row"] = float(self.empty_in_a_row)
        if not ok:
            reasons = sorted({tr.stop_reason.value for tr in trajs})
            self.console.print(
                f"[yellow]step {self.step_idx + 1}: no trajectory to train on (stop reasons "
                f"{reasons}); skipped[/]"
            )
        if self.empty_in_a_row >= self.cfg.trainer.max_empty_steps:
            raise TrainingError(
                f"{self.empty_in_a_row} steps in a row had no trajectory to train on (all "
                "infrastructure failures, no sampled token, or truncated under "
                f"rollout.truncated=mask; stop reasons {reasons}). Check "
                "the engine and sandbox logs in the run's output dir (truncated: raise "
                "rollout.max_new_tokens / max_context_tokens)"
            )
        return ok

    def _watch_signal(self, groups: list[list[Trajectory]], metrics: dict[str, float]) -> None:
        """Say so, loudly, when no group carries gradient (`_carries`) for
        `trainer.no_signal_steps` steps in a row: every advantage is 0 and the policy gradient is
        exactly zero. And once per run: per-turn rewards the reward level ignores."""
        self._warn_ignored_turn_rewards([tr for g in groups for tr in g])
        flat = not any(self._carries(g) for g in groups)
        self.no_signal_in_a_row = self.no_signal_in_a_row + 1 if flat else 0
        metrics["train/no_signal_steps_in_a_row"] = float(self.no_signal_in_a_row)
        k = self.cfg.trainer.no_signal_steps
        if k and self.no_signal_in_a_row and self.no_signal_in_a_row % k == 0:
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
            self._warn("no learning signal", msg)

    def _watch_tools(self, trajs: list[Trajectory], metrics: dict[str, float]) -> None:
        """A tool failing on most of its calls: warned at once, then every few steps while it
        lasts (`metrics.ToolWatch` says when); a note when it recovers."""
        out, warnings, notes = self.tool_watch.update(trajs, self.step_idx + 1)
        metrics.update(out)
        for msg in warnings:
            self._warn("tool failing", msg)
        for msg in notes:
            self.console.print(escape(msg), style="yellow")

    def _warn_ignored_turn_rewards(self, trajs: list[Trajectory]) -> None:
        """Once per run: per-turn rewards the reward level ignores."""
        level = self.cfg.algo.advantage.reward_level
        if not self.warned_turn_rewards and (msg := ignored_turn_rewards(trajs, level)):
            self.warned_turn_rewards = True
            self._warn("per-turn rewards ignored", msg)

    def _warn(self, title: str, msg: str) -> None:
        log.warning(msg)
        self.console.print(f"[bold red]warning:[/] {escape(msg)}")  # tool text is no markup
        self.tracker.alert(title, msg)

    async def run(self) -> list[dict[str, float]]:
        try:
            prepare_checkpoints(self.parts)  # pinned buffers, allocated behind the first rollout
            await self._loop()
            self._commit_saved(wait=True)
        finally:
            if self.saving is not None:  # the run failed: a checkpoint fully written still counts
                try:
                    self._commit_saved(wait=True)
                except Exception as e:  # the run's own error is the one to raise
                    log.warning("the checkpoint being written was abandoned: %s", e)
        return self.history

    async def _evaluate_if_due(self) -> dict[str, float]:
        every = self.cfg.trainer.eval_every
        due = every and (self.step_idx % every == 0 or self.step_idx == self.cfg.trainer.steps)
        return await self._evaluate() if due else {}

    async def _evaluate(self) -> dict[str, float]:
        """trainer.eval_every: the fixed evaluation set, rolled out by the weights the engines
        serve now (async: beside the training episodes in flight); one console line. Its
        episodes go to eval_trajectories.jsonl (and W&B eval/turns) at this step."""
        with sampling_round(self.sampling_seed, f"eval after step {self.step_idx}"):
            out, episodes = await evaluate(
                self.rollout, self.eval_tasks, self.cfg.trainer.eval_samples
            )
        self.tracker.log_eval(self.step_idx, episodes)
        n, samples = len(self.eval_tasks), self.cfg.trainer.eval_samples
        self.console.print(eval_text(out, self.step_idx, n, samples), soft_wrap=True)
        if out["eval/failed"]:
            self._warn("evaluation episodes failed", (
                f"{out['eval/failed']:.0f} of {out['eval/episodes']:.0f} evaluation episodes after "
                f"step {self.step_idx} failed (an engine down, the sandbox unavailable, a "
                "timeout or an env crash): eval/reward_mean is over the rest"))  # fmt: skip
        return out

    async def _loop(self) -> None:
        tc = self.cfg.trainer
        if tc.eval_every and self.step_idx == 0:  # the untrained policy: the curve's first point
            initial = await self._evaluate()
            self.tracker.log_step(0, {**initial, "step": 0.0})
        if tc.mode == "sync":
            while self.step_idx < tc.steps:
                self.history.append(await self.step())
            return
        self.producer = GroupProducer(self.rollout, self.sampler, tc.tasks_per_step,
                                      tc.max_staleness, tc.stale_policy, self.step_idx,
                                      keep=self._keep if tc.dynamic_sampling else None)  # fmt: skip
        resumed = self.parts.resumed
        if resumed is not None and "async" in resumed.extra:  # the groups it had in flight
            self.producer.load_state(resumed.extra["async"])
        async with producing(self.producer):
            while self.step_idx < tc.steps:
                self.history.append(await self.step())
        self.producer = None

    # -- parts ---------------------------------------------------------------------------------

    def _commit_saved(self, wait: bool) -> None:
        """The checkpoint being written becomes `latest` once its files are all written."""
        if self.saving is not None and finish_checkpoint(self.parts, self.saving, wait):
            self.saving = None

    def _save(self) -> None:
        self._commit_saved(wait=True)  # one checkpoint in flight at a time
        extra = {"async": self.producer.state_dict()} if self.producer is not None else {}
        self.saving = save_checkpoint(self.parts, self.step_idx, self.skipped_in_a_row, extra)

    def _log(self, metrics: dict[str, float], trajs: list[Trajectory]) -> None:
        """Documented names (agentrl/metrics.py) → sinks (metrics/trajectories JSONL, W&B) →
        the console line. step() returns `metrics`: the history gets the same names."""
        lps = self.trainer_logprobs
        final = step_metrics(metrics, trajs, lps)
        metrics.clear()
        metrics.update(final)
        self.tracker.log_step(self.step_idx, metrics, trajs, lps)
        self.console_line(metrics)
        every = self.cfg.logging.console_trajectories_every
        if every and trajs and self.step_idx % every == 0:
            self.console.print(trajectory_panel(trajs[pick(trajs, lps, 1)[0]]))

    def console_line(self, m: dict[str, float]) -> None:
        if self.progress is not None:
            self.progress(m)


async def train(cfg: Config, out_dir: Path) -> list[dict[str, float]]:
    """Build the run, train `trainer.steps` steps (from the checkpoint it resumes), close it.
    A run already at its last step says so and starts nothing."""
    refuse_if_held(out_dir, cfg.trainer.checkpoint_config(cfg.run_name).dir)  # before the lookup
    resume = resume_point(cfg)
    if resume is not None:
        done = load_trainer_state(resume).step
        if done >= cfg.trainer.steps:
            print(
                f"run {cfg.run_name!r} is already at step {done} of trainer.steps="
                f"{cfg.trainer.steps} ({resume}): nothing to train. Raise trainer.steps to go "
                "on, or start another run with run_name=<a new name>"
            )
            return []
    if cfg.trainer.deterministic:  # this process's own draws (a resumed run restores them)
        random.seed(cfg.seed)
        torch.manual_seed(cfg.seed)
    threads = torch.get_num_threads()
    torch.set_num_threads(cfg.trainer.driver_threads)
    try:
        async with open_run(cfg, out_dir) as run:
            return await Trainer(cfg, run).run()
    finally:
        torch.set_num_threads(threads)


def resume_note(cfg: Config) -> str:
    """Where a stopped run stands and how to go on (Ctrl-C)."""
    ckpt = CheckpointManager(cfg.trainer.checkpoint_config(cfg.run_name))
    path = ckpt.resume_path()
    if path is None:
        return (f"no checkpoint yet (one every trainer.every={cfg.trainer.every} steps): the same "
                "command starts over")  # fmt: skip
    how = "the same command" if cfg.trainer.resume == "auto" else "add trainer.resume=auto: it"
    return f"the last checkpoint is step {load_trainer_state(path).step} ({path}); {how} resumes from it"


def main() -> None:
    @hydra.main(config_path=str(CONFIG_DIR), config_name="config", version_base="1.3")
    def _run(raw: Any) -> None:
        logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per request is noise
        with errors_for_people(TrainingError):
            cfg = load_config(raw)
            try:
                history = asyncio.run(train(cfg, Path(HydraConfig.get().runtime.output_dir)))
            except KeyboardInterrupt:  # the servers and workers are closed by now
                print(f"\ninterrupted: {resume_note(cfg)}")
                raise SystemExit(130) from None
        if history:
            first, last = history[0], history[-1]
            print(
                f"done: {len(history)} steps, reward {first.get('reward/mean', math.nan):.3f} → "
                f"{last.get('reward/mean', math.nan):.3f}, tool_call_rate "
                f"{first['rollout/tool_call_rate']:.2f} → {last['rollout/tool_call_rate']:.2f}"
            )

    check_command_line()  # agentrl's message for a mistake, before Hydra's; no `+` needed
    _run()


if __name__ == "__main__":
    main()
