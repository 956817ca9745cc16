"""The typed config schema. Hydra composes `configs/`; `load_config` validates the result once, here.

Every model forbids unknown keys, so a misspelt key fails at start-up with its dotted path; on
the command line before Hydra composes (agentrl/cli/overrides.py), where no key needs a `+`:

    $ agentrl preview rollout.max_turn=3
    error: invalid override:
      rollout.max_turn: unknown key; did you mean rollout.max_turns?

Nothing below the entry points sees OmegaConf. Sections are owned by the module that uses them
(RolloutConfig lives in rollout.py, EngineConfig in engine/config.py, …) and composed here; the
trainer's groups and the keys an older config may still use (MOVED_KEYS, refused here with their
new names) in trainer_config.py. User classes are referenced by import path in `_target_`.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any, Literal

from hydra import compose as hydra_compose
from hydra import initialize_config_dir
from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig, OmegaConf
from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    Tag,
    ValidationError,
    field_validator,
    model_validator,
)

from agentrl.advantage import AdvantageConfig, needs_values
from agentrl.assets.build import resolve_builtin
from agentrl.ckpt import CheckpointConfig
from agentrl.cli.overrides import check_argv, check_overrides, unknown_key_hint
from agentrl.config_raw import import_user_modules, misread_settings
from agentrl.engine import EngineConfig
from agentrl.env_config import ENV_KINDS, EnvConfig, MixtureConfig, env_kind
from agentrl.idle_settings import idle_settings
from agentrl.learner import LearnerConfig, RayConfig
from agentrl.loss import LossConfig
from agentrl.rollout import RolloutConfig
from agentrl.sandbox.backends import BACKENDS
from agentrl.sandbox.config import SandboxConfig
from agentrl.settings_diff import settings_of
from agentrl.signal_checks import critic_checks, kl_checks, signal_checks
from agentrl.tracking import LoggingConfig
from agentrl.trainer_config import MOVED_KEYS, TrainerConfig
from agentrl.types import ConfigError
from agentrl.weight_sync import SYNC_METHODS, WeightSyncConfig

CONFIG_DIR = Path(__file__).resolve().parent / "configs"  # -> ../configs in a checkout


class ModelConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    path: str = Field("builtin:tiny", description="a local HF model dir, or builtin:<name>")
    tokenizer: str | None = Field(None, description="tokenizer dir; default: the model's")

    def resolve(self) -> Path:
        if self.path.startswith("builtin:"):
            return resolve_builtin(self.path.removeprefix("builtin:"))
        path = Path(self.path).expanduser()
        if not (path / "config.json").exists():
            raise ConfigError(
                f"model.path={self.path!r} is not a local model directory (no config.json); "
                "nothing is downloaded at run time — point it at a saved HF model or a builtin:<name>"
            )
        return path


class CriticConfig(BaseModel):
    """The value model of PPO (a learner of its own: same backbone, one-output head)."""

    model_config = ConfigDict(extra="forbid")

    enabled: bool | None = Field(
        None, description="None: on when the advantage estimator needs values (gae)"
    )
    model_path: str = Field("", description="backbone to start from; empty: the policy's model")
    lr: float | None = Field(None, ge=0, description="None: learner.lr")
    warmup_steps: int | None = Field(None, ge=0, description="None: learner.warmup_steps")


class AlgoConfig(BaseModel):
    """The algorithm is data: an advantage estimator and a loss, each chosen by name, and how
    many optimizer steps a batch gets (ppo_epochs x mini_batches)."""

    model_config = ConfigDict(extra="forbid")

    advantage: AdvantageConfig = Field(default_factory=AdvantageConfig)
    loss: LossConfig = Field(default_factory=LossConfig)
    reference: bool = Field(
        False, description="keep a frozen reference model (always on when loss.kl_coef > 0)"
    )
    ppo_epochs: int = Field(1, ge=1, description="passes over each step's batch")
    mini_batches: int = Field(
        1, ge=1, description="optimizer steps per pass; the batch's sequences are split evenly"
    )
    critic: CriticConfig = Field(default_factory=CriticConfig)
    old_logprobs: Literal["auto", "recompute"] = Field(
        "auto",
        description="pi_old, the trainer's logprobs of the sampled tokens before the update. "
        "recompute: a forward pass of its own before the update; auto: with one optimizer step "
        "per batch they are the update's own forward (same weights, same tokens; detached), so "
        "that pass is skipped, unless kl_mode=reward needs them before the advantages",
    )

    def kl_in_reward(self) -> bool:
        """The KL to the reference is a penalty on the rewards (kl_mode=reward, kl_coef > 0)."""
        return self.loss.kl_mode == "reward" and self.loss.kl_coef > 0

    def old_logprobs_from_update(self) -> bool:
        """algo.old_logprobs=auto and nothing needs pi_old before the (single) optimizer step."""
        return (
            self.old_logprobs == "auto" and self.ppo_epochs * self.mini_batches == 1
            and not self.kl_in_reward()
        )  # fmt: skip

    def uses_critic(self) -> bool:
        if self.critic.enabled is not None:
            return self.critic.enabled
        return needs_values(self.advantage.name)

    @model_validator(mode="after")
    def _critic_for_gae(self) -> AlgoConfig:
        if needs_values(self.advantage.name) and self.critic.enabled is False:
            raise ValueError(
                f"algo.advantage.name={self.advantage.name} needs a critic; drop algo.critic.enabled=false or pick a "
                "critic-free estimator (grpo, rloo, drgrpo, reinforce_pp_baseline)"
            )
        return self


class PreviewConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    tasks: int = Field(2, ge=1, description="agentrl preview: tasks to roll out")
    show: int = Field(4, ge=0, description="trajectories to print")


class Config(BaseModel):
    model_config = ConfigDict(extra="forbid")

    seed: int = 0
    run_name: str = Field(
        "", description="names runs/<run_name>/checkpoints; empty: from the env class (code_exec)"
    )
    env: Annotated[
        Annotated[EnvConfig, Tag("env")] | Annotated[MixtureConfig, Tag("mixture")],
        Discriminator(env_kind),
    ]
    model: ModelConfig = Field(default_factory=ModelConfig)
    engine: EngineConfig = Field(default_factory=EngineConfig)
    rollout: RolloutConfig = Field(default_factory=RolloutConfig)
    sandbox: SandboxConfig = Field(default_factory=SandboxConfig)
    preview: PreviewConfig = Field(default_factory=PreviewConfig)
    algo: AlgoConfig = Field(default_factory=AlgoConfig)
    learner: LearnerConfig = Field(default_factory=LearnerConfig)
    ray: RayConfig = Field(default_factory=RayConfig)
    weight_sync: WeightSyncConfig = Field(default_factory=WeightSyncConfig)
    trainer: TrainerConfig = Field(default_factory=TrainerConfig)
    checkpoint: CheckpointConfig = Field(default_factory=CheckpointConfig)
    logging: LoggingConfig = Field(default_factory=LoggingConfig)

    @field_validator("run_name", mode="before")
    @classmethod
    def _run_name_is_text(cls, v: Any) -> Any:
        """YAML (and Hydra) read an unquoted nan, 1e3, true or null as a number, a bool or None,
        whose text is gone (1e3 is 1000.0): refused with the quoted form, not guessed back."""
        if isinstance(v, str):
            return v
        raise ValueError(
            f"a {type(v).__name__}, not text: an unquoted nan, 1e3, true or null is read as one, "
            "and its text is lost (1e3 becomes 1000.0). Quote the name (YAML: run_name: '1e3'; "
            "command line: run_name=\"'1e3'\"), or leave it out for a name from the env"
        )

    @model_validator(mode="after")
    def _default_run_name(self) -> Config:
        target = self.env.target if isinstance(self.env, EnvConfig) else "mixture"
        self.run_name = run_name(self.run_name, target)
        return self

    def settings(self) -> dict[str, Any]:
        """Every setting, dotted keys, no secrets: what a checkpoint records (settings_diff.py)."""
        return settings_of(self.model_dump(mode="json", by_alias=True))

    def identity(self) -> dict[str, Any]:
        """What a run trains; a checkpoint of another identity is not resumed by accident (a
        mixture's: its envs and their tasks; not their weights, which a resumed run may change)."""
        env = self.env
        if isinstance(env, MixtureConfig):
            targets = {name: m.target for name, m in env.envs.items()}
            tasks: dict[str, Any] = {name: m.tasks for name, m in env.envs.items()}
        return {
            "env": env.target if isinstance(env, EnvConfig) else targets,
            "tasks": env.tasks if isinstance(env, EnvConfig) else tasks,
            "model": self.model.path,
            "advantage": self.algo.advantage.name,
            "loss": self.algo.loss.name,
        }

    @model_validator(mode="after")
    def _async_needs_separate_devices(self) -> Config:
        if self.trainer.mode != "async":
            return self
        if self.engine.colocate:
            raise ValueError(
                "trainer.mode=async needs the engines and the learner on separate devices "
                "(engine.colocate=false): colocated, they take turns on the GPU"
            )
        if self.trainer.sampling.oversample_groups:
            raise ValueError(
                "trainer.sampling.oversample_groups is for trainer.mode=sync; async rollouts "
                "already run ahead (trainer.async.max_staleness)"
            )
        return self

    @model_validator(mode="after")
    def _deterministic_needs_sync(self) -> Config:
        """Which groups a step trains, and which weights sampled them, must not follow timing."""
        t = self.trainer
        if t.deterministic and t.mode == "async":
            raise ValueError(
                "trainer.deterministic=true needs trainer.mode=sync: in async mode rollouts run "
                "beside the learner, so which weights sample which turn (and which turns a push "
                "cuts) depends on timing. Drop trainer.deterministic or use trainer.mode=sync"
            )
        if t.deterministic and t.sampling.oversample_groups:
            raise ValueError(
                "trainer.deterministic=true with trainer.sampling.oversample_groups="
                f"{t.sampling.oversample_groups}: the groups kept are the first to finish, which "
                "depends on timing. Set trainer.sampling.oversample_groups=0 or drop "
                "trainer.deterministic"
            )
        return self

    @model_validator(mode="after")
    def _template_thinking_trains_per_episode(self) -> Config:
        """Per-turn credit compares turn k across the group; a forked episode's sequences each
        count their turns from 0, so the indices would not be the episode's."""
        r = self.rollout
        for setting, on in (("rollout.thinking=template", r.thinking == "template"),
                            (f"rollout.context.policy={r.context.policy}", r.context.policy != "none")):  # fmt: skip
            if on and self.algo.advantage.reward_level == "turn":
                raise ValueError(
                    f"{setting} with algo.advantage.reward_level=turn: an episode rewritten "
                    "becomes several sequences, whose turn indices are not the episode's, so "
                    "per-turn baselines would compare the wrong turns. Drop the setting or use "
                    "reward_level=trajectory"
                )
        return self

    @model_validator(mode="after")
    def _tp_engines_join_as_tp_ranks(self) -> Config:
        """Every TP rank of a server receives the weights: the update group counts them."""
        tp, ranks = self.engine.tp, self.weight_sync.ranks_per_server
        if tp > 1 and ranks == 1:
            self.weight_sync.ranks_per_server = tp
        elif tp > 1 and ranks != tp:
            raise ValueError(
                f"weight_sync.ranks_per_server={ranks} but engine.tp={tp}: leave "
                "ranks_per_server at 1 (it follows engine.tp)"
            )
        return self

    @model_validator(mode="after")
    def _engines_placed_by_ray(self) -> Config:
        method = self.weight_sync.method
        if self.engine.placement == "ray" and SYNC_METHODS.get(method).same_host:
            raise ValueError(
                f"weight_sync.method={method} {SYNC_METHODS.get(method).summary} on the learner's "
                "host, but engine.placement=ray may start them on other nodes; use "
                "weight_sync.method=distributed (NCCL/gloo) or disk (a shared filesystem)"
            )
        return self

    @model_validator(mode="after")
    def _top_k(self) -> Config:  # here, not in rollout.py: that module is at its size limit
        if self.rollout.top_k == -1 or self.rollout.top_k >= 1:
            return self
        raise ValueError(
            f"rollout.top_k={self.rollout.top_k}: the engines take -1 (every token; SGLang and "
            "the dev server refuse each request with 0) or k >= 1 (the k most likely tokens)"
        )

    @model_validator(mode="after")
    def _sandbox_backend(self) -> Config:
        try:  # here, not in sandbox/config.py: the registry lives above the settings
            BACKENDS.check(self.sandbox.backend)
        except ValueError as e:
            raise ValueError(f"sandbox.backend: {e}") from None
        return self


def run_name(name: str | None, env_target: str | None) -> str:
    """The run's name: `name`, else the env class's (CodeExecEnv -> code_exec, KVEnv -> kv,
    HTTPFetchEnv -> http_fetch, MyEnv2 -> my_env2), so runs of different envs never share a
    directory. Also Hydra's `${agentrl_run_name:…}` resolver, which puts a training run's files
    in `runs/<run_name>/` (configs/config.yaml)."""
    if name:
        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,99}", name):
            raise ValueError(
                f"run_name={name[:120]!r}{'…' if len(name) > 120 else ''}: use up to 100 "
                "letters, digits, '_', '-' and '.' (it names a directory)"
            )
        return name
    cls = (env_target or "").replace(":", ".").rsplit(".", 1)[-1].removesuffix("Env")
    return _WORD_START.sub("_", cls).lower() or "default"


# where a CamelCase name's next word starts: after a lower-case letter (CodeExec), at an acronym's
# end (HTTPFetch), after digits (Tool2Call); never inside an acronym (KV, GSM8K)
_WORD_START = re.compile(r"(?<=[a-z])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])|(?<=[0-9])(?=[A-Z][a-z])")


def defaults_tree() -> dict[str, Any]:
    """Every setting's default, from the pydantic models above: the one place defaults live.
    Hydra composes the YAML files over this tree (configs/config.yaml lists it first), so the
    files carry only what differs, and any key can be overridden without a `+`."""
    tree: dict[str, Any] = {}
    for name, field in Config.model_fields.items():
        if field.is_required():  # env: chosen by the env group
            continue
        value = field.get_default(call_default_factory=True)
        if isinstance(value, BaseModel):
            value = value.model_dump(mode="json", by_alias=True)
        tree[name] = value
    return tree


def register_defaults() -> None:
    """Store `defaults_tree()` as the config `agentrl_defaults` in Hydra's ConfigStore, and the
    run-name resolver the run directory is named with."""
    ConfigStore.instance().store(name="agentrl_defaults", node=defaults_tree())
    OmegaConf.register_new_resolver("agentrl_run_name", _safe_run_name, replace=True)


def _safe_run_name(name: Any, target: Any, envs: Any = None) -> str:
    """`envs`: env.envs, a mixture's members (configs/config.yaml passes it). A name YAML read
    as no text (`run_name: 1e3` is 1000.0) names no directory after its lost text: validation
    refuses it, with the quoted form to write."""
    if name is not None and not isinstance(name, str):
        return "default"
    try:  # a bad name fails with its path in validation, not here in Hydra's start-up
        return run_name(str(name or ""), "mixture" if envs else str(target or ""))
    except ValueError:
        return "default"


def _check_mini_batches(cfg: Config) -> None:
    """A step's episodes (tasks x group size) are the fewest sequences it trains on: each is at
    least one (rollout.thinking=template, a context rewrite or an agent may make more, never
    fewer), so more mini-batches than episodes fail at the first step that forks none."""
    n, tasks, group = cfg.algo.mini_batches, cfg.trainer.tasks_per_step, cfg.rollout.group_size
    if n > tasks * group:
        raise ConfigError(
            f"algo.mini_batches={n} is more than the {tasks * group} episodes of a step "
            f"(trainer.tasks_per_step={tasks} x rollout.group_size={group}), the fewest sequences "
            f"a step can have to split: set algo.mini_batches={tasks * group} or fewer, or raise "
            "trainer.tasks_per_step or rollout.group_size"
        )


def training_checks(cfg: Config) -> list[str]:
    """Settings that are valid for a preview but wrong for training: errors raise ConfigError,
    doubtful ones come back as warnings to print."""
    if cfg.learner.routing_replay:
        check_moe(cfg.model.resolve())
    r = cfg.rollout
    _check_mini_batches(cfg)
    per_step = cfg.algo.ppo_epochs * cfg.algo.mini_batches  # optimizer steps: the lr schedule's
    warnings = signal_checks(r, cfg.learner, cfg.algo.advantage, cfg.trainer.steps, per_step)
    warnings += kl_checks(cfg.algo.loss)
    warnings += idle_settings(cfg.settings(), settings_of(defaults_tree()))  # set, never read
    uses, c = cfg.algo.uses_critic(), cfg.algo.critic
    warnings += critic_checks(cfg.learner, c.lr, c.warmup_steps, uses, cfg.trainer.steps, per_step)
    if r.top_p < 1.0 or r.top_k > 0:
        warnings.append(
            f"rollout.top_p={r.top_p:g} / rollout.top_k={r.top_k}: the engine samples from a "
            "truncated distribution but both the engine's and the trainer's logprobs are of the "
            "full one, so the ratio and the rollout correction ignore the truncation (tokens "
            "outside the nucleus are never sampled, the rest are slightly under-weighted). "
            "Prefer top_p=1.0 and top_k=-1 for training"
        )
    if cfg.trainer.deterministic and cfg.engine.kind == "sglang":
        warnings.append(
            "trainer.deterministic=true with engine.kind=sglang: the servers get "
            "--enable-deterministic-inference and every request a sampling seed, the learner "
            "torch's deterministic algorithms; equal runs are tested on CPU only. On GPUs also "
            "set learner.micro_batch_tokens to a number (auto follows free GPU memory) and keep "
            "the same GPUs and versions (docs/checkpoints.md)"
        )
    sync = cfg.weight_sync
    if (
        SYNC_METHODS.get(sync.method).shared_filesystem
        and not sync.disk_dir
        and (cfg.engine.placement == "ray" or cfg.ray.address)
    ):
        warnings.append(
            f"weight_sync.method={sync.method} writes under learner rank 0's /tmp; servers on "
            "other nodes will not see it: set weight_sync.disk_dir to a filesystem every node "
            "shares"
        )
    return warnings


def validate(raw: dict[str, Any]) -> Config:
    import_user_modules(raw)
    if misread := misread_settings(raw, Config):  # pydantic takes true as 1, and NaN
        raise ConfigError("invalid config:\n  " + "\n  ".join(misread))
    try:
        return Config.model_validate(raw)
    except ValidationError as e:
        lines = []
        for err in e.errors():
            why = "unknown key" if err["type"] == "extra_forbidden" else err["msg"]
            why = why.removeprefix("Value error, ")
            if not err["loc"]:  # a check across sections: its message names the setting
                lines.append(why[:300])
                continue
            loc = list(err["loc"])
            if loc[0] == "env" and len(loc) > 1 and loc[1] in ENV_KINDS:
                del loc[1]  # the union's tag (a single env or a mixture), not a key
            where = ".".join(str(p) for p in loc)
            if err["type"] == "extra_forbidden" and where in MOVED_KEYS:  # an older config's key
                lines.append(f"{where} moved to {MOVED_KEYS[where]} (got {err.get('input')!r})")
                continue
            if err["type"] == "extra_forbidden":  # a key in YAML or a `+key`: the closest known
                why += unknown_key_hint(Config, where)
            lines.append(f"{where}: {why} (got {err.get('input')!r})"[:300])
        raise ConfigError("invalid config:\n  " + "\n  ".join(lines)) from None


def load_config(cfg: DictConfig | dict[str, Any]) -> Config:
    """Validate a Hydra DictConfig (or a plain dict)."""
    raw = OmegaConf.to_container(cfg, resolve=True) if not isinstance(cfg, dict) else cfg
    assert isinstance(raw, dict), "a config is a mapping"
    raw.pop("hydra", None)
    return validate(raw)


register_defaults()  # before any Hydra app or compose() reads configs/


@contextlib.contextmanager
def errors_for_people(*kinds: type[BaseException]) -> Iterator[None]:
    """At the door of a command: a ConfigError (or one of `kinds`) prints as its message, no
    traceback, and exits 2; `AGENTRL_DEBUG=1` shows the traceback instead."""
    try:
        yield
    except (ConfigError, *kinds) as e:
        if os.environ.get("AGENTRL_DEBUG"):
            raise
        print(f"error: {e}\n(AGENTRL_DEBUG=1 shows the traceback)", file=sys.stderr)
        raise SystemExit(2) from None


def check_command_line() -> None:
    """Before a Hydra app reads sys.argv: its overrides checked against the schema (a mistake is
    agentrl's one message, never Hydra's "use `+`") and passed on so that no key needs a `+`
    (agentrl/cli/overrides.py)."""
    with errors_for_people():
        sys.argv[1:] = check_argv(sys.argv[1:], Config, CONFIG_DIR)


def compose(overrides: list[str] | None = None, name: str = "config") -> Config:
    """Compose configs/ with Hydra overrides, outside a Hydra app (tests, notebooks); the
    overrides are checked as on the command line (`check_command_line`)."""
    overrides = check_overrides(overrides or [], Config, CONFIG_DIR)
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        return load_config(hydra_compose(config_name=name, overrides=overrides))


_EXPERT_KEYS = ("num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts")


def check_moe(model_path: Path) -> None:
    """learner.routing_replay needs a mixture-of-experts model: ConfigError before any start."""
    config = json.loads((Path(model_path) / "config.json").read_text())
    if not any(config.get(k) for k in _EXPERT_KEYS):
        raise ConfigError(
            f"learner.routing_replay=true, but {model_path} is not a mixture-of-experts model "
            f"(its config.json has none of {', '.join(_EXPERT_KEYS)}): there are no routes to "
            "replay. Drop learner.routing_replay"
        )
