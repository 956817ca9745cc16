"""The learner side of a run (agentrl/run.py assembles the rest): the GPUs it shares with the
servers on one host, a loopback Ray, the learner groups per role (policy; reference when KL is
on; critic when the estimator needs values), resumed from the checkpoint, and in colocated mode
the offload mode chosen and checked against each host's memory before the servers start.
"""

from __future__ import annotations

import concurrent.futures
import logging
import math
from collections.abc import Callable
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape

from agentrl.ckpt import TrainerState, load_trainer_state, optimizer_note, restore_rng
from agentrl.config import Config
from agentrl.data import TaskSampler
from agentrl.engine import EngineConfig, split_local_gpus, visible_gpus
from agentrl.learner import LearnerConfig
from agentrl.learner.group import LearnerGroup
from agentrl.learner.memory import check_host, choose_offload, engine_fraction, host_bytes
from agentrl.learner.ray_start import ray_running, start_ray, stop_ray
from agentrl.mixture import MixtureSampler
from agentrl.settings_diff import compare, refusal
from agentrl.types import ConfigError
from agentrl.weight_sync import SYNC_METHODS

log = logging.getLogger(__name__)


def start_learners(
    cfg: Config,
    learner_gpus: list[str] | None,
    model_path: str,
    resume: Path | None,
    sampler: TaskSampler | MixtureSampler,
    stack: AsyncExitStack,
    out: Path,
    console: Console,
) -> tuple[dict[str, LearnerGroup], TrainerState | None]:
    """Ray (unless the caller runs one; on `learner_gpus`, from `split_gpus`), the learner
    groups, loaded from `resume` (with the sampler's cursor and the RNG states), offloaded in
    colocated mode so the engine takes the GPU first; each closer on `stack`. Returns the groups
    by role and the resumed state."""
    resumed = None
    if not ray_running():  # a Ray the caller runs (a script, a test session)
        start_ray(cfg.ray, gpus=learner_gpus)  # is theirs to stop; one this run starts,
        stack.callback(_quietly, "Ray", stop_ray)  # it stops
    groups = _learner_groups(cfg, model_path, stack, out)
    if resume is not None:
        resumed = _resume(cfg, resume, groups, sampler, console)
        console.print(f"[green]resumed from {resume} at step {resumed.step}[/]")
    if cfg.engine.colocate:  # the engine takes the GPU first; the learner waits on CPU
        _resolve_offload(cfg, groups, console)
        for group in groups.values():
            group.offload()
    return groups, resumed


def split_gpus(
    cfg: Config, engine_cfg: EngineConfig, console: Console
) -> tuple[list[str] | None, EngineConfig]:
    """engine.colocate=false on one host: the learner's ranks and the SGLang servers this run
    starts get GPUs of their own (servers.split_local_gpus); the run says which. Nothing to
    split under a Ray the caller runs (its GPUs are placed already)."""
    if ray_running() or cfg.ray.address or cfg.learner.resolved_device() != "cuda":
        return None, engine_cfg
    want = math.ceil(cfg.learner.num_workers * cfg.learner.num_gpus_per_worker)
    nccl = SYNC_METHODS.get(cfg.weight_sync.method).needs_nccl_group
    split = split_local_gpus(engine_cfg, want, visible_gpus(), nccl=nccl)
    if split is None:
        return None, engine_cfg
    learner, engine_cfg = split
    console.print(f"[dim]GPUs: learner {','.join(learner)}, servers {','.join(engine_cfg.gpus)}[/]")
    return learner, engine_cfg


def _resolve_offload(cfg: Config, groups: dict[str, LearnerGroup], console: Console) -> None:
    """Colocated: learner.offload=auto measures the GPU, chooses, tells every rank and says
    why; whatever the mode moves to host memory is checked against each host's, before the
    first rollout rather than at the first offload."""
    ranks = {role: g.memory_stats() for role, g in groups.items()}
    mem = ranks["policy"][0]
    if not mem["total_bytes"]:  # CPU: nothing to make room for, nothing moves
        if cfg.learner.offload == "auto":
            _set_offload(groups, "none", "learner.offload=auto chose none (no GPU)", console)
        return
    # what trains holds gradients and Adam moments; a frozen reference and a LoRA policy's base
    # weights do not (its adapters are a rounding error)
    lora_policy = cfg.learner.lora.rank > 0
    params = {role: (sum(math.prod(s.shape) for s in g.param_specs()),
                     role == "critic" or (role == "policy" and not lora_policy))
              for role, g in groups.items()}  # fmt: skip
    frozen_bytes = 2 if cfg.learner.use_bf16("cuda") else 4  # fsdp.store_frozen_in
    mode = cfg.learner.offload
    if mode == "auto":
        available = mem["free_bytes"] + sum(r[0]["reserved_gib"] * 2**30 for r in ranks.values())
        choice = choose_offload(
            list(params.values()), groups["policy"].world_size, available, mem["total_bytes"],
            engine_fraction(cfg.engine.extra_args), frozen_bytes,
        )  # fmt: skip
        mode = choice.mode
        _set_offload(groups, mode, choice.describe(), console)
    moved: dict[str, float] = {}
    free: dict[str, float] = {}
    for role, g in groups.items():
        share = host_bytes([params[role]], mode, frozen_bytes) / g.world_size
        for r in ranks[role]:
            moved[r["host"]] = moved.get(r["host"], 0.0) + share
            # what an offloaded learner holds there now is freed when it moves back
            free[r["host"]] = free.get(r["host"], r["host_available_bytes"]) + r["host_state_bytes"]
    error, warning = check_host(mode, moved, free)
    if error:
        raise ConfigError(error)
    if warning:
        log.warning(warning)
        console.print(f"[yellow]warning: {warning}[/]")


def _set_offload(groups: dict[str, LearnerGroup], mode: str, line: str, console: Console) -> None:
    for g in groups.values():
        g.set_offload(mode)
    log.info(line)
    console.print(f"[dim]{line}[/]")


def _learner_groups(
    cfg: Config, model_path: str, stack: AsyncExitStack, out_dir: Path
) -> dict[str, Any]:
    """The policy, and the reference and critic when the algorithm needs them; the roles' ranks
    share each GPU (Ray counts GPUs; memory is ours to manage)."""
    base: LearnerConfig = cfg.learner
    if cfg.trainer.deterministic:
        base = base.model_copy(update={"deterministic": True})
    if not base.model_path:
        base = base.model_copy(update={"model_path": model_path})
    if not Path(base.profile_dir).is_absolute():  # the run's output dir, not the workers' cwd
        base = base.model_copy(
            update={"profile_dir": str(Path(out_dir).resolve() / base.profile_dir)}
        )
    with_ref = cfg.algo.reference or cfg.algo.loss.kl_coef > 0
    with_critic = cfg.algo.uses_critic()
    roles = 1 + with_ref + with_critic
    if roles > 1 and base.num_gpus_per_worker >= 1:
        base = base.model_copy(update={"num_gpus_per_worker": base.num_gpus_per_worker / roles})
    configs: dict[str, LearnerConfig] = {}
    for role, wanted in (("policy", True), ("reference", with_ref), ("critic", with_critic)):
        if not wanted:
            continue
        lcfg = base
        if role == "critic":
            c = cfg.algo.critic
            update: dict[str, Any] = {"model_path": c.model_path or base.model_path}
            if c.lr is not None:
                update["lr"] = c.lr
            if c.warmup_steps is not None:
                update["warmup_steps"] = c.warmup_steps
            lcfg = base.model_copy(update=update)
        configs[role] = lcfg
    # the roles start side by side: a rank's start is mostly its process importing torch and
    # loading the model (3-4 s each on a 2-core CPU box), and a PPO run with a KL term has three
    with concurrent.futures.ThreadPoolExecutor(len(configs), "start-learner") as pool:
        started = {role: pool.submit(LearnerGroup, lcfg, role) for role, lcfg in configs.items()}
    out: dict[str, Any] = {}
    for role, future in started.items():
        if future.exception() is None:  # each started one is shut down with the run
            out[role] = group = future.result()
            stack.callback(_quietly, f"{role} learner", group.shutdown)
    for future in started.values():
        if (error := future.exception()) is not None:
            raise error
    return out


def _resume(
    cfg: Config,
    path: Path,
    groups: dict[str, LearnerGroup],
    sampler: TaskSampler | MixtureSampler,
    console: Console,
) -> TrainerState:
    state = load_trainer_state(path)
    optimizer = True  # what the checkpoint holds; checkpoint.save_optimizer is for saving
    for role in ("policy", "critic") if "critic" in groups else ("policy",):
        if note := optimizer_note(path, role):
            console.print(f"[yellow]note:[/] {escape(note)}")
    changes = compare(state.settings, cfg.settings())
    if error := refusal(changes, state.step, str(path)):  # resume_point stops these first
        raise ConfigError(error)  # never printed as applied: the checkpoint's values would load
    for c in changes:  # applied, never silently kept
        console.print(f"[yellow]{escape(str(c))} from step {state.step + 1}[/]")
    changed = groups["policy"].load_checkpoint(str(path / "policy"), optimizer=optimizer)
    for name, (then, now) in sorted(changed.items()):  # said above, unless the checkpoint is
        if not state.settings:  # older than its settings record
            console.print(f"[yellow]learner.{name} {then} → {now} from step {state.step + 1}[/]")
    if "critic" in groups:
        if not (path / "critic").exists():
            raise ConfigError(
                f"checkpoint {path} has no critic (it was trained without one), but "
                f"algo.advantage.name={cfg.algo.advantage.name} needs it; resume with the "
                "same algo, or start fresh with checkpoint.resume=never (or another run_name)"
            )
        changed = groups["critic"].load_checkpoint(str(path / "critic"), optimizer=optimizer)
        for name, (then, now) in sorted(changed.items()):
            if not state.settings:
                console.print(f"[yellow]critic {name} {then} → {now} from step {state.step + 1}[/]")
    sampler.load_state_dict(state.data_cursor)
    restore_rng(state.rng)
    return state


def _quietly(what: str, fn: Callable[[], Any]) -> None:
    """Teardown goes on when one part fails to close; say which."""
    try:
        fn()
    except Exception as e:
        log.warning("closing the %s failed: %s", what, e)
