"""`python -m agentrl.train env=code_exec …`: the RL loop.

Per step: sample tasks → rollout groups → advantages → update (FSDP2 on Ray) → weight sync →
log → checkpoint. `Trainer.step` below is the whole algorithm; `Trainer.start` builds the parts
(Ray on loopback, learner groups, rollout servers, sandbox, weight sync, resume) and `close`
stops them, also after errors.
"""

from __future__ import annotations

import asyncio
import math
import time
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import torch

from agentrl.advantage import compute_advantages
from agentrl.batch import TrainBatch, micro_batches
from agentrl.config import Config
from agentrl.loss import kl_estimate
from agentrl.metrics import rollout_metrics, step_metrics
from agentrl.types import Trajectory


class TrainingError(RuntimeError):
    """The run cannot go on; the message says why and what to do."""


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
    def __init__(self, cfg: Config, out_dir: Path) -> None:
        self.cfg, self.out = cfg, Path(out_dir)
        self.stack = ExitStack()
        self.step_idx = 0
        self.skipped_in_a_row = 0
        self.history: list[dict[str, float]] = []
        self.reference = None  # a frozen LearnerGroup when the algorithm uses one

    # -- the algorithm -------------------------------------------------------------------------

    async def step(self) -> dict[str, float]:
        cfg, t = self.cfg, Timer()
        with t("rollout"):
            tasks = self.sampler.next(cfg.trainer.tasks_per_step)
            groups = await self.rollout.run(tasks)
            trajs = [tr for g in groups for tr in g]
            await self._check_engines(trajs)
        with t("advantage"):
            adv = compute_advantages(groups, cfg.algo.advantage)
            batch = TrainBatch.from_trajectories(trajs, adv.advantages)
        metrics = {**rollout_metrics(trajs), **adv.metrics}
        self.trainer_logprobs: dict[int, torch.Tensor] = {}
        if batch.num_seqs:
            per_rank = micro_batches(batch, self.policy.world_size, cfg.learner.micro_batch_tokens)
            with t("to_learner"):
                await self._hand_gpu(to_learner=True)
            with t("logprobs"):
                per_rank = self._logprob_pass(per_rank, metrics)
            with t("update"):
                metrics.update(self._update(per_rank))
            with t("sync"):
                metrics.update(await self._sync(version=str(self.step_idx + 1)))
        self.step_idx += 1
        with t("checkpoint"):
            if self.ckpt.should_save(self.step_idx, cfg.trainer.steps):
                self._save()
        metrics.update(t.times, step=float(self.step_idx))
        metrics["perf/sampled_tokens_per_s"] = metrics["rollout/sampled_tokens"] / max(
            t.times["timing_s/rollout"], 1e-9
        )
        self._log(metrics, trajs)
        return metrics

    def _logprob_pass(
        self, per_rank: list[list[TrainBatch]], metrics: dict[str, float]
    ) -> list[list[TrainBatch]]:
        """Trainer logprobs before the update: their gap to the engine's (train/logprob_diff),
        the KL to the reference (train/kl_ref, when there is one), ref_logprobs for the loss."""
        temp = self.cfg.rollout.temperature
        ours = self.policy.compute_logprobs(per_rank, temp)
        refs = self.reference.compute_logprobs(per_rank, temp) if self.reference else None
        diff = kl = tokens = 0.0
        for r, mbs in enumerate(per_rank):
            for i, mb in enumerate(mbs):
                m = mb.loss_mask
                diff += float((mb.old_logprobs - ours[r][i]).abs()[m].sum())
                tokens += float(m.sum())
                if refs is not None:
                    kl += float(kl_estimate(ours[r][i], refs[r][i], "k3")[m].sum())
                    mbs[i] = mb.replace(ref_logprobs=refs[r][i])
                if not mb.is_padding:
                    for src, lp in zip(mb.source, mb.per_sequence(ours[r][i]), strict=True):
                        self.trainer_logprobs[src] = lp
        metrics["train/logprob_diff"] = diff / max(tokens, 1.0)
        if refs is not None:
            metrics["train/kl_ref"] = kl / max(tokens, 1.0)
        return per_rank

    async def _hand_gpu(self, to_learner: bool) -> None:
        """Colocated mode: the engine frees its GPU memory for the update, the learner moves
        its state back onto the GPU (and the reverse after the sync). A no-op otherwise."""
        if not self.cfg.engine.colocate:
            return
        groups = [g for g in (self.policy, self.reference) if g is not None]
        if to_learner:
            await self.engine.release_memory_occupation()
            for g in groups:
                g.onload()
        else:
            for g in groups:
                g.offload()
            await self.engine.resume_memory_occupation(["kv_cache", "cuda_graph"])

    async def _sync(self, version: str) -> dict[str, float]:
        if self.cfg.engine.colocate:  # weights first, so the learner's tensors can land there
            await self.engine.resume_memory_occupation(["weights"])
        out = await self.sync.push(version=version)
        await self._hand_gpu(to_learner=False)
        return out

    def _update(self, per_rank: list[list[TrainBatch]]) -> dict[str, float]:
        cfg = self.cfg
        out = self.policy.train_step(
            per_rank, cfg.algo.loss.name, cfg.algo.loss, cfg.rollout.temperature
        )
        skipped = out.get("policy/skipped", 0.0) > 0
        self.skipped_in_a_row = self.skipped_in_a_row + 1 if skipped else 0
        out["train/skipped_steps_in_a_row"] = float(self.skipped_in_a_row)
        if self.skipped_in_a_row >= cfg.trainer.max_skipped_steps:
            raise TrainingError(
                f"{self.skipped_in_a_row} optimizer steps in a row had a non-finite loss or "
                f"gradient (last grad_norm={out.get('policy/grad_norm')}); the run diverged. "
                "Lower learner.lr, check rewards for NaN, then resume with trainer.resume=auto"
            )
        return out

    async def run(self) -> list[dict[str, float]]:
        while self.step_idx < self.cfg.trainer.steps:
            self.history.append(await self.step())
        return self.history

    # -- parts ---------------------------------------------------------------------------------

    async def start(self) -> Trainer:
        from agentrl import parts

        await parts.start(self)
        return self

    async def close(self) -> None:
        from agentrl import parts

        await parts.close(self)

    async def _check_engines(self, trajs: list[Trajectory]) -> None:
        if not any(tr.stop_reason.is_infra_failure for tr in trajs):
            return
        health = await self.engine.health()
        dead = [url for url, ok in health.items() if not ok]
        if dead:
            raise TrainingError(
                f"rollout server(s) {dead} stopped answering during step {self.step_idx + 1} "
                f"(logs in {self.out}); fix the cause and resume with trainer.resume=auto"
            )

    def _save(self) -> None:
        from agentrl import parts

        parts.save_checkpoint(self)

    def _log(self, metrics: dict[str, float], trajs: list[Trajectory]) -> None:
        """Documented names (agentrl/metrics.py) → sinks (metrics/trajectories JSONL, W&B) →
        the console line. step() returns `metrics`: the history gets the same names."""
        lps = getattr(self, "trainer_logprobs", {})
        final = step_metrics(metrics, trajs, lps)
        metrics.clear()
        metrics.update(final)
        self.tracker.log_step(self.step_idx, metrics, trajs, lps)
        self.console_line(metrics)
        every = self.cfg.logging.console_trajectories_every
        if every and trajs and self.step_idx % every == 0:
            from agentrl.display import trajectory_panel
            from agentrl.trajectory_view import pick

            self.console.print(trajectory_panel(trajs[pick(trajs, lps, 1)[0]]))

    def console_line(self, m: dict[str, float]) -> None:
        self.progress(m)


async def train(cfg: Config, out_dir: Path) -> list[dict[str, float]]:
    trainer = Trainer(cfg, out_dir)
    try:
        await trainer.start()
        return await trainer.run()
    finally:
        await trainer.close()


def main() -> None:
    import hydra

    from agentrl.config import CONFIG_DIR, load_config

    @hydra.main(config_path=str(CONFIG_DIR), config_name="config", version_base="1.3")
    def _run(raw: Any) -> None:
        import logging

        from hydra.core.hydra_config import HydraConfig

        logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per request is noise
        cfg = load_config(raw)
        history = asyncio.run(train(cfg, Path(HydraConfig.get().runtime.output_dir)))
        if history:
            first, last = history[0], history[-1]
            print(
                f"done: {len(history)} steps, reward {first.get('reward/mean', math.nan):.3f} → "
                f"{last.get('reward/mean', math.nan):.3f}, tool_call_rate "
                f"{first['rollout/tool_call_rate']:.2f} → {last['rollout/tool_call_rate']:.2f}"
            )

    _run()


if __name__ == "__main__":
    main()
