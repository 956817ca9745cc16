"""Build, resume and stop the parts of a training run (kept out of train.py so the loop stays short).

Start order: tokenizer and env → tasks and sampler → checkpoint lookup → Ray (loopback) and the
policy learner (+ reference when KL is on) → rollout servers (started from the resumed weights
when resuming) → engine client → sandbox → rollout → weight sync. `close` undoes all of it in
reverse, whatever failed.
"""

from __future__ import annotations

import contextlib
import logging
from typing import TYPE_CHECKING

from rich.console import Console

if TYPE_CHECKING:
    from agentrl.train import Trainer

log = logging.getLogger(__name__)


async def start(tr: Trainer) -> None:
    from transformers import AutoTokenizer

    from agentrl.ckpt import CheckpointManager, load_trainer_state, restore_rng
    from agentrl.config import training_checks
    from agentrl.data import TaskSampler
    from agentrl.display import ProgressLine
    from agentrl.engine import EngineClient
    from agentrl.learner import LearnerGroup, start_ray
    from agentrl.parsers import ConfigError
    from agentrl.rollout import Rollout
    from agentrl.servers import launch_engines
    from agentrl.tracking import Tracker
    from agentrl.weight_sync import make_weight_sync
    from sandbox import make_sandbox

    cfg = tr.cfg
    tr.console = Console()
    for warning in training_checks(cfg):  # raises ConfigError before anything starts
        tr.console.print(f"[yellow]warning:[/] {warning}")
    tr.out.mkdir(parents=True, exist_ok=True)
    model_path = cfg.model.resolve()
    tokenizer = AutoTokenizer.from_pretrained(cfg.model.tokenizer or model_path)
    tr.tokenizer = tokenizer
    env_cls = cfg.env.load_class()
    tr.sampler = TaskSampler(env_cls.load_tasks(**cfg.env.tasks), seed=cfg.seed)
    tr.ckpt = CheckpointManager(cfg.trainer.checkpoint_config())
    resume = tr.ckpt.resume_path()
    wandb_run_id = None

    start_ray(cfg.ray)
    learner_cfg = cfg.learner
    if not learner_cfg.model_path:
        learner_cfg = learner_cfg.model_copy(update={"model_path": str(model_path)})
    with_ref = cfg.algo.reference or cfg.algo.loss.kl_coef > 0
    with_critic = cfg.algo.uses_critic()
    roles = 1 + with_ref + with_critic
    if roles > 1 and learner_cfg.num_gpus_per_worker >= 1:
        # the roles' ranks share each GPU (Ray counts GPUs; memory is ours to manage)
        share = learner_cfg.num_gpus_per_worker / roles
        learner_cfg = learner_cfg.model_copy(update={"num_gpus_per_worker": share})
    tr.policy = LearnerGroup(learner_cfg, "policy")
    if with_ref:
        tr.reference = LearnerGroup(learner_cfg, "reference")
    if with_critic:
        c = cfg.algo.critic
        update = {"model_path": c.model_path or learner_cfg.model_path}
        if c.lr is not None:
            update["lr"] = c.lr
        if c.warmup_steps is not None:
            update["warmup_steps"] = c.warmup_steps
        tr.critic = LearnerGroup(learner_cfg.model_copy(update=update), "critic")
    engine_model = model_path
    if resume is not None:
        state = load_trainer_state(resume)
        tr.policy.load_checkpoint(str(resume / "policy"), optimizer=cfg.trainer.save_optimizer)
        if tr.critic is not None:
            if not (resume / "critic").exists():
                raise ConfigError(
                    f"checkpoint {resume} has no critic (it was trained without one), but "
                    f"algo.advantage.name={cfg.algo.advantage.name} needs it; resume with the "
                    "same algo, or start fresh with trainer.resume=never (or another run_name)"
                )
            tr.critic.load_checkpoint(str(resume / "critic"), optimizer=cfg.trainer.save_optimizer)
        tr.step_idx, tr.skipped_in_a_row = state.step, state.consecutive_skips
        wandb_run_id = state.wandb_run_id  # the resumed run continues the same W&B run
        tr.sampler.load_state_dict(state.data_cursor)
        restore_rng(state.rng)
        engine_model = resume / "policy" / "model"
        tr.console.print(f"[green]resumed from {resume} at step {state.step}[/]")

    if cfg.engine.colocate:  # the engine takes the GPU first; the learner waits on the CPU
        for group in (tr.policy, tr.reference, tr.critic):
            if group is not None:
                group.offload()
    urls = tr.stack.enter_context(launch_engines(cfg.engine, engine_model, tr.out))
    tr.engine = EngineClient.from_config(cfg.engine.model_copy(update={"urls": urls}))
    await tr.engine.wait_healthy(cfg.engine.health_timeout_s)
    await tr.engine.update_weight_version(str(tr.step_idx))
    tr.sandbox = make_sandbox(cfg.sandbox)
    tr.rollout = Rollout(tr.engine, tokenizer, env_cls, cfg.rollout, cfg.env.args, tr.sandbox)
    tr.sync = make_weight_sync(cfg.weight_sync, tr.policy, tr.engine)
    await tr.sync.setup()
    config = cfg.model_dump(mode="json")
    tr.tracker = Tracker(cfg.logging, tr.out, run_name=cfg.run_name, config=config,
                         run_id=wandb_run_id, tokenizer=tokenizer, console=tr.console)  # fmt: skip
    tr.progress = ProgressLine(cfg.trainer.steps, tr.step_idx, tr.console)


async def close(tr: Trainer) -> None:
    tracker = getattr(tr, "tracker", None)
    if tracker is not None:  # first: W&B marks the run failed if an exception is on its way
        tracker.close()
    for attr, method in (("sync", "close"), ("sandbox", "aclose"), ("engine", "aclose")):
        part = getattr(tr, attr, None)
        if part is not None:
            try:
                await getattr(part, method)()
            except Exception as e:  # keep tearing down
                log.warning("closing the %s failed: %s", attr, e)
    tr.stack.close()  # rollout servers
    for group in (getattr(tr, "policy", None), tr.reference, tr.critic):
        if group is not None:
            with contextlib.suppress(Exception):
                group.shutdown()
    from agentrl.learner import stop_ray

    with contextlib.suppress(Exception):
        stop_ray()


def save_checkpoint(tr: Trainer) -> None:
    from agentrl.ckpt import TrainerState, capture_rng

    cfg = tr.cfg.trainer
    with tr.ckpt.write(tr.step_idx) as pending:
        tr.policy.save_checkpoint(
            str(pending.path / "policy"), optimizer=cfg.save_optimizer, fmt=cfg.optimizer_format
        )
        if tr.critic is not None:
            tr.critic.save_checkpoint(
                str(pending.path / "critic"),
                optimizer=cfg.save_optimizer,
                fmt=cfg.optimizer_format,
            )
        pending.state = TrainerState(
            step=tr.step_idx,
            weight_version=str(tr.step_idx),
            data_cursor=tr.sampler.state_dict(),
            rng=capture_rng(),
            consecutive_skips=tr.skipped_in_a_row,
            wandb_run_id=tr.tracker.run_id if getattr(tr, "tracker", None) else None,
        )
