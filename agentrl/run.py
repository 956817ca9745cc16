"""Assembly: build every part of a run from the config, hand them out as one typed `Run`, and take
them down in reverse order, whatever failed.

    async with open_run(cfg, out_dir) as run:          # training: every part
        trainer = Trainer(cfg, run)
    async with open_run(cfg, out_dir, train=False) as run:   # `agentrl preview`: rollout parts only
        groups = await run.rollout.run(tasks)

Build order (each part's closer is registered as it is built, so teardown is the exact reverse):
tokenizer and env → tasks and sampler → checkpoint lookup → Ray (loopback) and the learner groups
(policy; reference when KL is on; critic when the estimator needs values), resumed from the
checkpoint (agentrl/run_learners.py) → rollout servers (from the resumed weights) → engine client → sandbox → rollout →
weight sync → tracker (closed first, so W&B marks a failed run as failed) → progress line.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console
from transformers import AutoTokenizer

from agentrl.agent_rollout import agent_notes
from agentrl.ckpt import (
    CheckpointManager,
    StagedCheckpoint,
    TrainerState,
    capture_rng,
    load_trainer_state,
)
from agentrl.config import Config, training_checks
from agentrl.data import TaskSampler
from agentrl.display import ProgressLine, make_console
from agentrl.engine import (
    DETERMINISTIC,
    EngineClient,
    EngineConfig,
    Fleet,
    check_deterministic,
    launch_fleet,
    launch_router,
    warn_uncaptured,
)
from agentrl.env import Env
from agentrl.env_config import EnvConfig
from agentrl.evaluate import eval_task_sets
from agentrl.learner.group import LearnerGroup
from agentrl.mixture import MixtureRollout, MixtureSampler, namespaced
from agentrl.render import RenderError
from agentrl.rollout import Rollout
from agentrl.run_learners import split_gpus, start_learners
from agentrl.runlock import hold_run_dirs
from agentrl.sandbox import Sandbox, make_sandbox
from agentrl.settings_diff import compare, refusal
from agentrl.tracking import JsonlSink, Tracker
from agentrl.types import ConfigError, Task
from agentrl.weight_sync import (
    AdapterSync,
    Transport,
    lora_sglang_args,
    make_weight_sync,
    planned_lora_sync,
    resolve_lora_sync,
)

log = logging.getLogger(__name__)


@dataclass
class Run:
    """Every part of one run. The rollout parts are always there; the training parts (learner
    groups, weight sync, checkpoints, tracker) only for `open_run(..., train=True)`."""

    cfg: Config
    out: Path
    console: Console
    tokenizer: Any  # a transformers tokenizer with the model's chat template
    env_cls: type[Env] | None  # None for a mixture (env=mixture: its classes are in rollout)
    sampler: TaskSampler | MixtureSampler
    engine: EngineClient
    sandbox: Sandbox
    rollout: Rollout | MixtureRollout
    fleet: Fleet | None = None  # the servers this run started, restarted when they fail
    policy: LearnerGroup | None = None
    reference: LearnerGroup | None = None  # frozen, when the algorithm uses one
    critic: LearnerGroup | None = None  # when the advantage estimator needs values
    sync: Transport | None = None
    ckpt: CheckpointManager | None = None
    resumed: TrainerState | None = None  # the checkpoint this run continues, if any
    tracker: Tracker | None = None
    progress: ProgressLine | None = None
    eval_tasks: list[Task] = field(default_factory=list)  # trainer.eval.every's fixed set

    def learner_groups(self) -> list[LearnerGroup]:
        return [g for g in (self.policy, self.reference, self.critic) if g is not None]


@contextlib.asynccontextmanager
async def open_run(cfg: Config, out: Path, *, train: bool = True) -> AsyncIterator[Run]:
    """Build the parts `cfg` asks for (see the module docstring); yield them; close them in
    reverse on exit. `train=False` builds only what a rollout needs (no Ray, no learner)."""
    console = make_console()
    if train:
        for warning in training_checks(cfg):  # raises ConfigError before anything starts
            console.print(f"[yellow]warning:[/] {warning}")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    async with AsyncExitStack() as stack:
        # one run per dir (agentrl/runlock.py): before anything there is moved or written
        ckpt_dir = cfg.checkpoint.of_run(cfg.run_name).dir if train else None
        stack.enter_context(hold_run_dirs(out, ckpt_dir, lambda s: console.print(f"note: {s}")))
        model_path = cfg.model.resolve()
        tokenizer = AutoTokenizer.from_pretrained(cfg.model.tokenizer or model_path)
        classes = env_classes(cfg)
        sampler, eval_tasks, eval_lines = samplers(cfg, classes, train)  # checked before the start
        for line in eval_lines:
            console.print(f"[dim]{line}[/]")
        for env_cls in classes.values():  # template and parser: before any server
            prepare_rollout(tokenizer, env_cls, cfg)
        r = cfg.rollout  # AgentEnvs: settings they never read, where their agents run
        for note in agent_notes(classes, r.max_turns, r.context.policy,
                                r.gateway.agent_workers, cfg.engine.kind):  # fmt: skip
            console.print(note)
        sandbox_start = _start_beside(stack, "sandbox", make_sandbox, cfg.sandbox)
        # LoRA: adapters through SGLang's LoRA routes (the servers serve the base), or merged
        lora_mode = planned_lora_sync(cfg.learner.lora, cfg.engine) if train else None
        engine_cfg = _engine_config(cfg, lora_mode, train)
        groups: dict[str, LearnerGroup] = {}
        ckpt = resumed = resume = fleet = None
        engine_model = model_path
        if train:
            ckpt = CheckpointManager(cfg.checkpoint.of_run(cfg.run_name))
            resume = resume_point(cfg, ckpt)  # before anything starts: a wrong one is an error
            if resume is not None and lora_mode != "adapter":  # else the base; its adapter
                engine_model = resume / "policy" / "model"  # comes after the start
            learner_gpus, engine_cfg = split_gpus(cfg, engine_cfg, console)
            if not cfg.engine.colocate and engine_cfg.placement == "local":
                # the servers load while the learners start (colocated, the learner goes
                # first and steps aside; servers Ray places need Ray up)
                fleet = stack.enter_context(launch_fleet(engine_cfg, engine_model, out, False))
            groups, resumed = start_learners(
                cfg, learner_gpus, str(model_path), resume, sampler, stack, out, console
            )
        fleet, engine = await _start_engines(cfg, engine_cfg, engine_model, out, stack, fleet)
        await _check_servers(cfg, engine, train)
        await engine.control.update_weight_version(str(resumed.step if resumed else 0))
        sandbox: Sandbox = await asyncio.wrap_future(sandbox_start)
        rollout = make_rollout(cfg, classes, engine, tokenizer, sandbox)
        stack.push_async_callback(_aquietly, "rollout", rollout.aclose)  # an agent's gateway
        single = classes[""] if isinstance(cfg.env, EnvConfig) else None
        run = Run(cfg, out, console, tokenizer, single, sampler, engine, sandbox, rollout,
                  fleet=fleet, ckpt=ckpt, resumed=resumed, eval_tasks=eval_tasks,
                  **groups)  # fmt: skip
        if train:
            await _start_training(run, stack, lora_mode, resume)
        yield run


def _engine_config(cfg: Config, lora_mode: str | None, train: bool) -> EngineConfig:
    """engine.* with the server flags the run adds: SGLang's LoRA routes for adapters, and
    batch-invariant servers for trainer.deterministic (restarts keep them)."""
    engine_cfg = cfg.engine
    if lora_mode == "adapter" and engine_cfg.kind == "sglang":
        lora_args = lora_sglang_args(
            cfg.learner.lora, engine_cfg.extra_args, colocate=engine_cfg.colocate
        )
        engine_cfg = engine_cfg.model_copy(
            update={"extra_args": [*lora_args, *engine_cfg.extra_args]}
        )
    if train and cfg.trainer.deterministic and DETERMINISTIC not in engine_cfg.extra_args:
        engine_cfg = engine_cfg.model_copy(  # batch-invariant servers (restarts keep it)
            update={"extra_args": [*engine_cfg.extra_args, DETERMINISTIC]}
        )
    if train and cfg.learner.routing_replay and ROUTED not in engine_cfg.extra_args:
        engine_cfg = engine_cfg.model_copy(  # the servers return each position's experts
            update={"extra_args": [*engine_cfg.extra_args, ROUTED]}
        )
    return engine_cfg


ROUTED = "--enable-return-routed-experts"  # SGLang's flag (R3), and the dev server's


async def _start_engines(
    cfg: Config,
    engine_cfg: EngineConfig,
    model: Path,
    out: Path,
    stack: AsyncExitStack,
    fleet: Fleet | None = None,
) -> tuple[Fleet, EngineClient]:
    """The rollout servers this run starts (none for engine.urls; `fleet`: started already,
    maybe still loading), the router when one is wanted, and the client over them, once every
    server answers its health check."""
    if fleet is None:
        fleet = stack.enter_context(launch_fleet(engine_cfg, model, out))
    else:
        fleet.wait()
    urls = fleet.urls
    router = stack.enter_context(launch_router(cfg.engine, urls, out))
    engine = EngineClient.from_config(cfg.engine.model_copy(update={"urls": urls}), router=router)
    engine.gen.routed_experts = cfg.learner.routing_replay  # return_routed_experts per request
    stack.push_async_callback(_aquietly, "engine client", engine.aclose)
    await engine.control.wait_healthy(cfg.engine.health_timeout_s)
    return fleet, engine


async def _check_servers(cfg: Config, engine: EngineClient, train: bool) -> None:
    """trainer.deterministic: every server computes requests apart (an error if not); the user's
    own servers (engine.urls): a warning where they decode past their CUDA graphs."""
    if train and cfg.trainer.deterministic:
        await check_deterministic(engine)
    if cfg.engine.urls:
        await warn_uncaptured(engine, cfg.trainer.tasks_per_step * cfg.rollout.group_size)


async def _start_training(
    run: Run, stack: AsyncExitStack, lora_mode: str | None, resume: Path | None
) -> None:
    """The training parts of `run` once its servers answer: the weight sync (serving a resumed
    run's adapters), the tracker (continuing the resumed run's JSONL and W&B run) and the
    progress line."""
    cfg, engine, console, resumed = run.cfg, run.engine, run.console, run.resumed
    assert run.policy is not None and run.fleet is not None
    lora_mode = await resolve_lora_sync(lora_mode, engine, cfg.engine.colocate)
    if lora_mode is not None:
        what = "the adapters (LoRA routes)" if lora_mode == "adapter" else "merged weights"
        console.print(f"[dim]learner.lora.sync={cfg.learner.lora.sync}: the engines get "
                      f"{what}[/]")  # fmt: skip
    run.sync = make_weight_sync(
        cfg.weight_sync, run.policy, engine, adapters=lora_mode == "adapter"
    )
    stack.push_async_callback(_aquietly, "weight sync", run.sync.close)
    run.sync.server_gpus = run.fleet.gpus if cfg.engine.colocate else None
    await run.sync.setup()
    if resume is not None and resumed is not None and isinstance(run.sync, AdapterSync):
        version = str(resumed.step)
        await run.sync.serve(f"agentrl-v{version}-resumed", resume / "policy" / "adapter",
                             version)  # fmt: skip
    moved = JsonlSink.continue_run(run.out, resumed.step if resumed else None)
    aside = run.ckpt.set_aside() if run.ckpt is not None and resumed is None else None
    for note in (moved, aside):
        if note:
            console.print(f"[yellow]note:[/] {note}")
    run.tracker = Tracker(
        cfg.logging, run.out, run_name=cfg.run_name, config=cfg.model_dump(mode="json"),
        run_id=resumed.wandb_run_id if resumed else None, tokenizer=run.tokenizer,
        console=console,
    )  # fmt: skip
    stack.push(_close_tracker(run.tracker))
    run.progress = ProgressLine(cfg.trainer.steps, resumed.step if resumed else 0, console)


def env_classes(cfg: Config) -> dict[str, type[Env]]:
    """The env class of the run (under the name ""), or a mixture's, by name (env=mixture)."""
    if isinstance(cfg.env, EnvConfig):
        return {"": cfg.env.load_class()}
    return cfg.env.load_classes()


def samplers(
    cfg: Config, classes: dict[str, type[Env]], train: bool = True
) -> tuple[TaskSampler | MixtureSampler, list[Task], list[str]]:
    """The training tasks' sampler, the evaluation tasks (`task_sets`) and the console lines
    about them. A mixture: each env's tasks and evaluation set apart (ids `<env>/<id>`), drawn
    by weight (agentrl/mixture.py)."""
    if isinstance(cfg.env, EnvConfig):
        tasks, eval_tasks, line = task_sets(cfg, classes[""], train)
        return TaskSampler(tasks, seed=cfg.seed), eval_tasks, [line] if line else []
    members: dict[str, TaskSampler] = {}
    eval_tasks, lines = [], []
    for name, section in cfg.env.envs.items():
        tasks, evals, line = task_sets(cfg, classes[name], train, section, f"env.envs.{name}")
        members[name] = TaskSampler(namespaced(name, tasks), seed=cfg.seed)
        eval_tasks += namespaced(name, evals)
        lines += [f"{name}: {line}"] if line else []
    weights = {name: section.weight for name, section in cfg.env.envs.items()}
    return MixtureSampler(members, weights, seed=cfg.seed), eval_tasks, lines


def task_sets(
    cfg: Config,
    env_cls: type[Env],
    train: bool = True,
    section: EnvConfig | None = None,
    where: str = "env",
) -> tuple[list[Task], list[Task], str]:
    """The training tasks, the evaluation tasks (trainer.eval.every; none when it is 0 or not
    training) and the line that says whether they are held out (trainer.eval.split), of
    `section` (default: cfg.env; a mixture's member at `where`)."""
    env = section or cfg.env
    assert isinstance(env, EnvConfig), "a mixture's tasks are its envs' (samplers)"
    tasks = env.load_tasks(env_cls, where=where)
    if not (train and cfg.trainer.eval.every):
        return tasks, [], ""
    candidates = (
        None if env.eval_tasks is None else env.load_tasks(env_cls, evaluation=True, where=where)
    )
    ev = cfg.trainer.eval
    return eval_task_sets(tasks, candidates, ev.size, cfg.seed, ev.split)


def make_rollout(
    cfg: Config,
    classes: dict[str, type[Env]],
    engine: EngineClient,
    tokenizer: Any,
    sandbox: Sandbox,
) -> Rollout | MixtureRollout:
    """The run's Rollout; a mixture's is one per env, each with its env's args."""
    if isinstance(cfg.env, EnvConfig):
        return Rollout(engine, tokenizer, classes[""], cfg.rollout, cfg.env.args, sandbox)
    members = {
        name: Rollout(engine, tokenizer, classes[name], cfg.rollout, section.args, sandbox)
        for name, section in cfg.env.envs.items()
    }
    return MixtureRollout(members)


def prepare_rollout(tokenizer: Any, env_cls: type[Env], cfg: Config) -> None:
    """`Rollout.prepare` at start-up: a chat template that cannot work is a ConfigError (one
    line at the door); one that works only with its thinking mode off says which setting does."""
    key = "model.tokenizer" if cfg.model.tokenizer else "model.path"
    where = f"{key}={cfg.model.tokenizer or cfg.model.path}"
    try:
        Rollout.prepare(tokenizer, env_cls, cfg.rollout)
    except (RenderError, ConfigError) as e:
        if _works_without_thinking(tokenizer, env_cls, cfg):
            raise ConfigError(
                f"{where}: the chat template works only with its thinking mode off: set "
                f"rollout.template_kwargs.enable_thinking=false (in thinking mode: {e})"
            ) from e
        raise ConfigError(f"{where}: {e}") from e


def _works_without_thinking(tokenizer: Any, env_cls: type[Env], cfg: Config) -> bool:
    kwargs = cfg.rollout.template_kwargs
    if "enable_thinking" in kwargs:
        return False
    off = cfg.rollout.model_copy(update={"template_kwargs": {**kwargs, "enable_thinking": False}})
    try:
        Rollout.prepare(tokenizer, env_cls, off)
    except Exception:  # not the thinking mode: the first error is the one to show
        return False
    return True


def resume_point(cfg: Config, ckpt: CheckpointManager | None = None) -> Path | None:
    """The checkpoint this run continues from (checkpoint.resume), or None. A checkpoint of another
    run (env, tasks, model or algorithm differ) found by `resume=auto` is a ConfigError: resuming
    it would continue someone else's weights and data cursor without a word. Found or named
    (`resume=<dir>`), a changed setting that a run under way cannot take is a ConfigError too:
    the checkpoint's weights, data cursor and RNG states would load while the command said else."""
    ckpt = ckpt or CheckpointManager(cfg.checkpoint.of_run(cfg.run_name))
    if (path := ckpt.resume_path()) is None:
        return None
    state = load_trainer_state(path)
    theirs, ours = state.identity, cfg.identity()
    if cfg.checkpoint.resume == "auto" and theirs and theirs != ours:  # found, not named
        # a misspelt env option or an env that does not import differs too: its own error first
        samplers(cfg, env_classes(cfg))
        diff = ", ".join(
            f"{k}: {theirs.get(k)!r} there, {ours.get(k)!r} here"
            for k in sorted(set(theirs) | set(ours))
            if theirs.get(k) != ours.get(k)
        )
        raise ConfigError(
            f"{ckpt.root} holds another run ({diff}). Start this one fresh with "
            f"run_name=<a new name> (or checkpoint.resume=never), or resume that one with the "
            f"settings it ran with (checkpoint.resume={path} names it from any run_name)"
        )
    if error := refusal(compare(state.settings, cfg.settings()), state.step, str(path)):
        raise ConfigError(error)
    ckpt.check_whole(path)  # its files all there and whole: the engine starts on them
    return path


def prepare_checkpoints(run: Run) -> None:
    """checkpoint.async_save: the learners allocate their host buffers for the checkpoints
    (pinned on GPUs) in a thread while the first rollout runs, so the first save does not stop
    training for it."""
    if not run.cfg.checkpoint.async_save or run.policy is None:
        return
    for group in (run.policy, run.critic):
        if group is not None:
            group.prepare_checkpoint()


def save_checkpoint(
    run: Run, step: int, consecutive_skips: int, extra: dict[str, Any] | None = None
) -> PendingCheckpoint | None:
    """The policy (and critic) weights + optimizer, the sampler's cursor, RNG states, the W&B
    run id: everything a resumed run needs to continue as if never stopped. `extra`: the
    trainer's own state (async mode: the groups in flight, agentrl/producer.py).

    checkpoint.async_save: returns once the learners' state is copied to CPU memory, with the
    checkpoint still to commit (`finish_checkpoint`, once the background writes are done; the
    state recorded here is this step's). Otherwise committed before it returns (None)."""
    assert run.ckpt is not None and run.policy is not None, "a preview run has no checkpoints"
    cfg = run.cfg.checkpoint
    pending = run.ckpt.begin(step)
    groups = {n: g for n, g in (("policy", run.policy), ("critic", run.critic)) if g is not None}
    try:
        for name, group in groups.items():
            group.save_checkpoint(str(pending.path / name), optimizer=cfg.save_optimizer,
                                  fmt=cfg.optimizer_format, background=cfg.async_save)  # fmt: skip
    except BaseException:
        run.ckpt.abandon(pending)
        raise
    pending.state = TrainerState(
        step=step,
        weight_version=str(step),
        data_cursor=run.sampler.state_dict(),
        rng=capture_rng(),
        consecutive_skips=consecutive_skips,
        identity=run.cfg.identity(),
        settings=run.cfg.settings(),
        wandb_run_id=run.tracker.run_id if run.tracker else None,
        extra=extra or {},
    )
    save = PendingCheckpoint(pending, list(groups.values()))
    if not cfg.async_save:
        finish_checkpoint(run, save, wait=True)
        return None
    return save


@dataclass
class PendingCheckpoint:
    """A checkpoint whose files the learners are still writing (checkpoint.async_save)."""

    staged: StagedCheckpoint
    groups: list[LearnerGroup]


def finish_checkpoint(run: Run, save: PendingCheckpoint, wait: bool) -> bool:
    """Commit `save` once every learner has written its part (`wait`: block until then); True
    when committed. A failed write abandons it (`latest` stays on the previous checkpoint)."""
    assert run.ckpt is not None
    try:
        if not all(g.finish_checkpoint(wait) for g in save.groups):
            return False
        run.ckpt.finish(save.staged)
    except BaseException:
        run.ckpt.abandon(save.staged)
        raise
    return True


def _close_tracker(tracker: Tracker) -> Callable[..., None]:
    def close(exc_type: Any, exc: Any, tb: Any) -> None:
        tracker.close(failed=exc_type is not None)

    return close


def _start_beside(
    stack: AsyncExitStack, what: str, make: Callable[..., Any], *args: Any
) -> concurrent.futures.Future:
    """`make(*args)` in a thread of its own, started now, so that what blocks in it (a service's
    start) overlaps what the caller does meanwhile; the stack closes what it made (`aclose`),
    whether or not the caller got as far as awaiting it. The thread lives until then: a process
    it spawns dies with the thread that spawned it (`die_with_parent`), not with the run."""
    pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix=f"start-{what}")
    future = pool.submit(make, *args)

    async def close() -> None:
        try:
            made = await asyncio.wrap_future(future)
        except Exception as e:  # noqa: BLE001 - raised to the caller too, if it got that far
            log.warning("the %s did not start: %s", what, e)
        else:
            await _aquietly(what, made.aclose)
        finally:
            pool.shutdown(wait=False)  # the thread ends once what it spawned is stopped

    stack.push_async_callback(close)
    return future


async def _aquietly(what: str, fn: Callable[[], Any]) -> None:
    try:
        await fn()
    except Exception as e:
        log.warning("closing the %s failed: %s", what, e)
