"""The RL loop (`agentrl train env=code_exec …`, or `python -m agentrl.train …`). Its choices:

1. Batch: every trajectory with a sampled token, except infrastructure failures (aborted by the
   system, sandbox_unavailable: out of the batch AND of the group baselines, counted).
2. Ratio: new / the trainer's own logprobs from before this step's first update (ratio=trainer);
   the engine's logprobs only weight it through TIS/MIS (rollout_correction), never the clip.
3. KL to a frozen reference: off by default; kl_mode=loss (k3 in the loss) or kl_mode=reward
   (per-token penalty subtracted before the advantages).
4. Advantages: per group from rewards (grpo, rloo, drgrpo, …) or a critic (gae); a step where
   no group carries gradient (`advantage.carries_gradient`: every advantage 0) is loudly
   reported after `trainer.guards.no_signal_steps` such steps; dynamic sampling drops such groups.
5. Optimizer steps per batch: ppo_epochs x mini_batches (default 1 x 1, the on-policy case).
6. Weights go to the engines after the last optimizer step; every token records its version.

Per step: take groups → score the sampled tokens with the current weights → advantages → update
(FSDP2 on Ray) → push → guards → log/checkpoint. `Trainer.step` is the whole algorithm, over its
parts: where groups come from (agentrl/groups.py: sync or async, over-sampling, refills, dynamic
sampling, staleness, re-issue after a loss), the hand-over between learner and engines
(agentrl/handover.py: GPU memory, the push under `exclusive`, restarts) and the run's health
(agentrl/guards.py: counters, warnings, stops). `agentrl.run.open_run` builds the processes and
clients (Ray on loopback, learner groups, rollout servers, sandbox, weight sync, resume) and
closes them in reverse, also after errors; the Trainer builds its three parts from them.

In more detail, in the order they happen:
- What is trained on: every trajectory with at least one sampled token whose StopReason is not an
  infrastructure failure (aborted, sandbox_unavailable: left out of the batch and of the group
  baselines, counted as stop/<reason>). Episodes whose env or reward code raised count against
  `trainer.guards.max_aborted_frac`; above it the run stops and shows one traceback. A step with
  nothing to train on is skipped (`trainer.guards.max_empty_steps` in a row stop the run): the
  engines keep their weights under the next version, in both modes (`Handover.relabel`).
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
- Evaluation (`trainer.eval.every`): a fixed task set rolled out before the first step and after
  every N-th and the last, never trained on (agentrl/evaluate.py; `eval/*` in the step's metrics,
  and a step-0 row of its own for the untrained policy).
"""

from __future__ import annotations

import asyncio
import logging
import math
import random
import time
from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import hydra
import torch
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig
from rich.console import Console

from agentrl import collector
from agentrl.advantage import Truncation, compute_advantages
from agentrl.batch import TrainBatch, mini_batches, per_trajectory
from agentrl.ckpt import CheckpointError, CheckpointManager, load_trainer_state
from agentrl.cli.logs import quiet_third_party
from agentrl.config import (
    CONFIG_DIR,
    Config,
    check_command_line,
    errors_for_people,
    load_config,
)
from agentrl.display import eval_text, trajectory_panel
from agentrl.evaluate import evaluate
from agentrl.groups import AsyncGroups, GroupSource, Reissue, SyncGroups
from agentrl.guards import Guards, Limits, Signal
from agentrl.handover import Handover
from agentrl.learner.group import LearnerGroup
from agentrl.loss import kl_reward_penalty
from agentrl.metrics import gap_and_kl_metrics, mean_over_steps, rollout_metrics, step_metrics
from agentrl.mixture import MixtureRollout
from agentrl.producer import GroupProducer
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
from agentrl.types import TrainingError, Trajectory

__all__ = ["Trainer", "TrainingError", "main", "train"]

log = logging.getLogger(__name__)
R = TypeVar("R")


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


class Trainer:
    """The algorithm over the parts of a `Run` (agentrl/run.py builds and closes them): its
    group source, hand-over and guards are built here from the run and the config."""

    def __init__(self, cfg: Config, run: Run) -> None:
        if run.policy is None or run.sync is None or run.tracker is None or run.ckpt is None:
            raise ValueError("Trainer needs a training run: open_run(cfg, out, train=True)")
        self.cfg, self.parts = cfg, run
        self.policy: LearnerGroup = run.policy
        self.tracker: Tracker = run.tracker
        self.ckpt: CheckpointManager = run.ckpt
        self.step_idx = run.resumed.step if run.resumed else 0  # steps done
        # rollout.truncated: what advantages and the batch do with a length-truncated episode
        self.truncation = Truncation(cfg.rollout.truncated, cfg.rollout.truncated_reward)
        skipped = run.resumed.consecutive_skips if run.resumed else 0
        self.guards = make_guards(cfg, run.console, run.tracker.alert, self.truncation, skipped)
        cut = cfg.trainer.mode == "async" and cfg.trainer.async_.partial_rollouts
        self.handover = Handover(run.engine, run.sync, run.learner_groups(), cfg.engine,
                                 run.fleet, cut, run.out, run.console)  # fmt: skip
        self.groups: GroupSource = make_groups(cfg, run, self.handover, self.guards, self.step_idx)
        self.history: list[dict[str, float]] = []
        self.trainer_logprobs: dict[int, torch.Tensor] = {}  # this step's, by trajectory index
        self.saving: PendingCheckpoint | None = None  # checkpoint.async_save: files being written
        # trainer.deterministic: each round's requests are seeded by their place (seeding.py)
        self.sampling_seed = cfg.seed if cfg.trainer.deterministic else None

    # -- the algorithm -------------------------------------------------------------------------

    async def step(self) -> dict[str, float]:
        cfg, t, step = self.cfg, Timer(), self.step_idx + 1
        with t("rollout"), sampling_round(self.sampling_seed, f"step {step}"):
            groups, taken = await self.groups.take(step)  # async: the wait for finished groups
            trajs = [tr for g in groups for tr in g]
            self.guards.check_crashes(trajs, step)
        metrics = {**step_rollout_metrics(self.parts, groups, trajs, self.truncation), **taken}
        self.guards.after_rollout(groups, trajs, metrics, step, sync=not self.groups.concurrent)
        self.trainer_logprobs = {}
        if not self.guards.trainable(trajs, metrics, step):  # skipped: the weights stay as they are
            with t("sync"):
                await self.handover.relabel(version=str(step))
            return await self._finish(metrics, trajs, t, trained=False)
        # Score the sampled tokens with the weights about to be trained (_score says with what);
        # truncated episodes under rollout.truncated=mask too: their KL penalty is in their score
        per_rank = self.policy.micro_batches(TrainBatch.from_trajectories(trajs, None))
        with t("to_learner"):
            await self.handover.to_learner()
        with t("logprobs"):
            scores = await self._blocking(self._score, per_rank, trajs, metrics)
        with t("advantage"):
            adv = compute_advantages(groups, cfg.algo.advantage, scores.get("values"),
                                     scores.get("penalties"), self.truncation)  # fmt: skip
            batch = TrainBatch.from_trajectories(
                trajs, adv.advantages, self.truncation, returns=adv.returns,
                trainer_old_logprobs=scores.get("trainer_old_logprobs"),
                ref_logprobs=scores.get("ref_logprobs"), values=scores.get("values"),
            )  # fmt: skip
        metrics.update(adv.metrics)
        with t("update"):
            ref = scores.get("ref_logprobs")
            metrics.update(await self._blocking(self._update, batch, trajs, ref))
        self.guards.watch_update(metrics, step, stale=self.groups.concurrent)
        with t("sync"):
            metrics["engine/restarts"] += await self.handover.revive_before_push(step)
            metrics.update(await self.handover.push(version=str(step)))
        metrics.update(peak_memory(self.parts))
        return await self._finish(metrics, trajs, t, trained=True)

    async def _finish(
        self, metrics: dict[str, float], trajs: list[Trajectory], t: Timer, trained: bool
    ) -> dict[str, float]:
        """The step is done (the engines serve its version): checkpoint, evaluation, log."""
        self.step_idx += 1
        self.groups.advance(self.step_idx)  # async: the next groups may launch (none hangs)
        with t("checkpoint"):  # what blocks: async_save writes the files behind later steps
            self._commit_saved(wait=False)
            if self.ckpt.should_save(self.step_idx, self.cfg.trainer.steps):
                self._save()
        metrics.update(t.times, step=float(self.step_idx))
        if trained:
            metrics["perf/sampled_tokens_per_s"] = metrics["rollout/sampled_tokens"] / max(
                t.times["timing_s/rollout"], 1e-9
            )
        every = self.cfg.trainer.eval.every
        if every and (self.step_idx % every == 0 or self.step_idx == self.cfg.trainer.steps):
            metrics.update(await self._evaluate())  # its time is eval/timing_s, not the step's
        self._log(metrics, trajs)
        return metrics

    async def _blocking(self, fn: Callable[..., R], *args: Any) -> R:
        """The learner's blocking calls (Ray round trips): in async mode off the event loop, so
        the rollouts it drives keep going meanwhile."""
        if not self.groups.concurrent:
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
        temp, reference, critic = cfg.rollout.temperature, self.parts.reference, self.parts.critic
        if not cfg.algo.old_logprobs_from_update():
            out_per_mb["trainer_old_logprobs"] = self.policy.compute_logprobs(per_rank, temp)
        if reference is not None:
            out_per_mb["ref_logprobs"] = reference.compute_logprobs(per_rank, temp)
        if critic is not None:
            out_per_mb["values"] = critic.compute_values(per_rank)
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

    def _update(
        self, batch: TrainBatch, trajs: list[Trajectory], ref: list[torch.Tensor] | None
    ) -> dict[str, float]:
        """`algo.ppo_epochs` passes over the batch, each split into `algo.mini_batches`
        optimizer steps (shuffled per epoch). Every step's ratio uses the same denominator: the
        trainer's logprobs from before the first step (or the engine's with ratio=engine)."""
        cfg, algo, critic = self.cfg, self.cfg.algo, self.parts.critic
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
                if critic is not None:
                    out.update(critic.train_step(per_rank, "value_clip", algo.loss))
                steps.append(out)
                self.guards.after_optimizer_step(out)
        out = mean_over_steps(steps)
        out["train/optimizer_steps"] = float(len(steps))
        out["train/skipped_steps_in_a_row"] = float(self.guards.skipped_in_a_row)
        return out

    # -- the run -------------------------------------------------------------------------------

    async def run(self) -> list[dict[str, float]]:
        """`trainer.steps` steps (from the resumed one), with the untrained policy's evaluation
        first (trainer.eval.every); the checkpoint being written is committed, also on error."""
        tc = self.cfg.trainer
        settled = collector.settle()  # the set-up's objects out of the collector's passes
        try:
            prepare_checkpoints(self.parts)  # pinned buffers, allocated behind the first rollout
            if tc.eval.every and self.step_idx == 0:  # the untrained policy: the curve's start
                initial = await self._evaluate()
                self.tracker.log_step(0, {**initial, "step": 0.0})
            async with self.groups:  # async: the producer runs ahead inside
                while self.step_idx < tc.steps:
                    self.history.append(await self.step())
            self._commit_saved(wait=True)
        finally:
            if self.saving is not None:  # the run failed: a checkpoint fully written still counts
                try:
                    self._commit_saved(wait=True)
                except Exception as e:  # the run's own error is the one to raise
                    log.warning("the checkpoint being written was abandoned: %s", e)
            collector.restore(settled)  # once the run is over (tests run many in a process)
        return self.history

    async def _evaluate(self) -> dict[str, float]:
        """trainer.eval.every: the fixed evaluation set, rolled out by the weights the engines
        serve now (async: beside the training episodes in flight); one console line. Its
        episodes go to eval_trajectories.jsonl (and W&B eval/turns) at this step."""
        tasks, samples = self.parts.eval_tasks, self.cfg.trainer.eval.samples
        with sampling_round(self.sampling_seed, f"eval after step {self.step_idx}"):
            out, episodes = await evaluate(self.parts.rollout, tasks, samples)
        self.tracker.log_eval(self.step_idx, episodes)
        self.parts.console.print(eval_text(out, self.step_idx, len(tasks), samples), soft_wrap=True)
        if out["eval/failed"]:
            self.guards.warn("evaluation episodes failed", (
                f"{out['eval/failed']:.0f} of {out['eval/episodes']:.0f} evaluation episodes after "
                f"step {self.step_idx} failed (an engine down, the sandbox unavailable, a "
                "timeout or an env crash): eval/reward_mean is over the rest"))  # fmt: skip
        return out

    def _commit_saved(self, wait: bool) -> None:
        """The checkpoint being written becomes `latest` once its files are all written."""
        if self.saving is not None and finish_checkpoint(self.parts, self.saving, wait):
            self.saving = None

    def _save(self) -> None:
        self._commit_saved(wait=True)  # one checkpoint in flight at a time
        extra = self.groups.state_dict()  # async: the groups in flight
        self.saving = save_checkpoint(self.parts, self.step_idx, self.guards.skipped_in_a_row,
                                      extra)  # fmt: skip

    def _log(self, metrics: dict[str, float], trajs: list[Trajectory]) -> None:
        """Documented names (agentrl/metrics.py) → sinks (metrics/trajectories JSONL, W&B) →
        the console line. step() returns `metrics`: the history gets the same names."""
        lps = self.trainer_logprobs
        final = step_metrics(metrics, trajs, lps)
        metrics.clear()
        metrics.update(final)
        self.tracker.log_step(self.step_idx, metrics, trajs, lps)
        if self.parts.progress is not None:
            self.parts.progress(metrics)
        every = self.cfg.logging.console_trajectories_every
        if every and trajs and self.step_idx % every == 0:
            self.parts.console.print(trajectory_panel(trajs[pick(trajs, lps, 1)[0]]))


# -- the parts -------------------------------------------------------------------------------


def make_guards(
    cfg: Config,
    console: Console,
    alert: Callable[[str, str], None],
    truncation: Truncation | None = None,  # None: rollout.truncated=train
    skipped_in_a_row: int = 0,
) -> Guards:
    """The run's health checks, with the `trainer.guards.*` limits and the run's signal rule."""
    g = cfg.trainer.guards
    limits = Limits(g.max_aborted_frac, g.max_empty_steps, g.no_signal_steps, g.max_skipped_steps,
                    g.warn_logprob_gap, g.warn_tool_fail_rate, cfg.learner.grad_clip)  # fmt: skip
    signal = Signal(cfg.algo.advantage, cfg.algo.kl_in_reward(), truncation or Truncation())
    return Guards(limits, signal, console, alert, skipped_in_a_row)


def make_groups(
    cfg: Config, run: Run, handover: Handover, guards: Guards, version: int
) -> GroupSource:
    """trainer.mode: rolled out when a step asks (sync), or ahead of it (async, from policy
    version `version`); dynamic sampling keeps the groups `guards.keep` keeps."""
    tc, sampling = cfg.trainer, cfg.trainer.sampling
    reissue = Reissue(run.rollout, handover, cfg.rollout.group_size,
                      tc.guards.max_unavailable_frac, str(run.out))  # fmt: skip
    keep = guards.keep if sampling.dynamic_sampling else None
    if tc.mode == "sync":
        return SyncGroups(run.sampler, run.rollout, reissue, tc.tasks_per_step,
                          sampling.oversample_groups, keep, sampling.max_refill_rounds)  # fmt: skip
    producer = GroupProducer(run.rollout, run.sampler, tc.tasks_per_step, tc.async_.max_staleness,
                             tc.async_.stale_policy, version, keep, sampling.max_refill_rounds)  # fmt: skip
    resumed = run.resumed.extra.get("async") if run.resumed is not None else None
    return AsyncGroups(producer, reissue, tc.tasks_per_step, resumed)


def step_rollout_metrics(
    run: Run, groups: list[list[Trajectory]], trajs: list[Trajectory], truncation: Truncation
) -> dict[str, float]:
    """rollout/*, stop/*, … of the step's trajectories; env=mixture: env/<name>/* beside them."""
    metrics = rollout_metrics(trajs, truncation)
    if isinstance(run.rollout, MixtureRollout):
        metrics.update(run.rollout.env_metrics(groups, truncation))
    return metrics


def peak_memory(run: Run) -> dict[str, float]:
    """perf/peak_mem_gb/<phase>: the learners' own GPU allocations at most, this step (the
    engine's memory is the server's; `ref_`/`critic_` prefix the other roles)."""
    out = {}
    roles = {"": run.policy, "ref_": run.reference, "critic_": run.critic}
    for prefix, group in roles.items():
        if group is not None:
            for phase, gib in group.peak_memory().items():
                out[f"perf/peak_mem_gb/{prefix}{phase}"] = gib
    return out


async def train(cfg: Config, out_dir: Path) -> list[dict[str, float]]:
    """Build the run, train `trainer.steps` steps (from the checkpoint it resumes), close it.
    A run already at its last step says so and starts nothing."""
    refuse_if_held(out_dir, cfg.checkpoint.of_run(cfg.run_name).dir)  # before the lookup
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
    ckpt = CheckpointManager(cfg.checkpoint.of_run(cfg.run_name))
    path = ckpt.resume_path()
    if path is None:
        return (f"no checkpoint yet (one every checkpoint.every={cfg.checkpoint.every} steps): "
                "the same command starts over")  # fmt: skip
    auto = cfg.checkpoint.resume == "auto"
    how = "the same command" if auto else "add checkpoint.resume=auto: it"
    step = load_trainer_state(path).step
    return f"the last checkpoint is step {step} ({path}); {how} resumes from it"


def summary_line(history: list[dict[str, float]]) -> str:
    """The run's last line: reward and tool-call rate over its first and its last steps (up to
    5 each: one step alone is noise; a new user read a dip at the last step as the result)."""
    k = max(1, min(5, len(history) // 2))

    def mean(rows: list[dict[str, float]], key: str) -> float:
        vals = [r[key] for r in rows if key in r]
        return sum(vals) / len(vals) if vals else math.nan

    head, tail = history[:k], history[-k:]
    reward = "reward/mean_all" if any("reward/mean_all" in r for r in history) else "reward/mean"
    # a step with no group carrying gradient (every advantage 0): a rising reward then is noise
    flat = sum(1 for r in history if r.get("train/no_signal_steps_in_a_row", 0) > 0)
    note = f"; {flat} of {len(history)} steps had no learning signal (every advantage 0)"
    return (
        f"done: {len(history)} steps, reward {mean(head, reward):.3f} → "
        f"{mean(tail, reward):.3f}, tool_call_rate {mean(head, 'rollout/tool_call_rate'):.2f}"
        f" → {mean(tail, 'rollout/tool_call_rate'):.2f} (the mean of the first and of the last "
        f"{k} step{'s' if k > 1 else ''})" + (note if flat else "")
    )


def main() -> None:
    @hydra.main(config_path=str(CONFIG_DIR), config_name="config", version_base="1.3")
    def _run(raw: DictConfig) -> None:
        quiet_third_party()
        with errors_for_people(TrainingError, CheckpointError):
            cfg = load_config(raw)
            try:
                history = asyncio.run(train(cfg, Path(HydraConfig.get().runtime.output_dir)))
            except KeyboardInterrupt:  # the servers and workers are closed by now
                print(f"\ninterrupted: {resume_note(cfg)}")
                raise SystemExit(130) from None
        if history:
            print(summary_line(history))

    check_command_line()  # agentrl's message for a mistake, before Hydra's; no `+` needed
    _run()


if __name__ == "__main__":
    main()
