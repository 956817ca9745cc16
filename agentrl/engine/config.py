"""`engine.*`: which rollout servers a run uses (dev server or SGLang), how many, where, and how
the client talks to them. `agentrl.engine.EngineClient.from_config` reads the client's part;
`agentrl.engine.fleet` launches what `kind`, `num_servers`, `tp` and `placement` ask for.

Every server, and the router, that a run starts takes the run's token (`api_key`): without
`Authorization: Bearer <token>` they answer 401 (/health stays open). It is this process's random
token unless `engine.api_key` or $AGENTRL_ENGINE_API_KEY names one (servers you start yourself,
`engine.urls`: the key they were started with). It never appears on a command line (other users
read those): SGLang reads it from a 0600 `--config` file, the dev server and the router from
their environment."""

from __future__ import annotations

import os
import secrets
from typing import Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    field_serializer,
    field_validator,
    model_validator,
)

API_KEY_ENV = "AGENTRL_ENGINE_API_KEY"
# this process's run token: the servers it starts take it, its clients send it. Never with a
# leading "-": argparse (SGLang's, smg's) would read it as an option
RUN_TOKEN = "agentrl-" + secrets.token_urlsafe(32)
# trainer.deterministic: SGLang's flag for batch-invariant inference; the dev server takes the same
# (each request computed alone, agentrl/engine/dev/batch.py)
DETERMINISTIC = "--enable-deterministic-inference"


def flag_value(args: list[str], *names: str) -> str | None:
    """The value of the first of `names` in a launch command line (`--flag V` or `--flag=V`;
    "" for a flag with nothing after it), None when none is there."""
    for i, arg in enumerate(args):
        name, eq, value = arg.partition("=")
        if name in names:
            return value if eq else (args[i + 1] if i + 1 < len(args) else "")
    return None


def default_api_key() -> str:
    """$AGENTRL_ENGINE_API_KEY, else this process's random run token."""
    return os.environ.get(API_KEY_ENV) or RUN_TOKEN


class EngineConfig(BaseModel):
    """Where the rollout engines are and how the client talks to them."""

    model_config = ConfigDict(extra="forbid")

    kind: Literal["dev", "sglang"] = Field("dev", description="dev: agentrl.engine.dev (CPU)")
    colocate: bool = Field(
        False, description="servers share GPUs with the learner (release/resume memory per step)"
    )
    urls: list[str] = Field(default_factory=list, description="empty: host + base_port + i")
    num_servers: int = Field(1, ge=1, description="servers to launch when urls is empty")
    host: str = "127.0.0.1"
    base_port: int = Field(30000, ge=1, le=65535)
    model_path: str | None = Field(None, description="served model; None: the trained model")
    api_key: str | None = Field(
        None,
        repr=False,
        description="Bearer token of the servers and the router: those a run starts take it; "
        "with engine.urls, the key your servers were started with (SGLang --api-key and "
        "--admin-api-key, dev server $AGENTRL_ENGINE_API_KEY). None: $AGENTRL_ENGINE_API_KEY, "
        "else a random token of this process (`token()`). Prefer the variable: a command-line "
        "override is written to the run's .hydra/overrides.yaml",
    )
    device: str = Field("cpu", description="dev server device")
    extra_args: list[str] = Field(default_factory=list, description="appended to the launch")
    timeout_s: float = Field(600.0, gt=0, description="one /generate or weight-update call")
    connect_timeout_s: float = Field(5.0, gt=0)
    max_retries: int = Field(3, ge=0, description="extra attempts after the first")
    backoff_s: float = Field(0.5, ge=0, description="first retry delay; doubles each retry")
    max_backoff_s: float = Field(8.0, ge=0)
    unhealthy_cooldown_s: float = Field(5.0, ge=0, description="skip a failed server this long")
    health_timeout_s: float = Field(300.0, gt=0, description="wait_healthy() at start-up")
    max_connections: int = Field(1024, ge=1)
    router: Literal["auto", "smg", "none"] = Field(
        "auto",
        description="several servers: route /generate through SGLang's model gateway (smg), "
        "each episode pinned to one server by consistent hashing of its key, so its prefix "
        "stays in that server's cache; auto: smg when there is more than one server and smg "
        "is installed; none: the client balances (least in-flight, sticky per episode)",
    )
    router_policy: str = Field(
        "consistent_hashing", description="smg --policy (cache_aware, round_robin, …)"
    )
    router_args: list[str] = Field(default_factory=list, description="appended to smg launch")
    batch_window_ms: float = Field(0.0, ge=0, description="coalesce /generate calls to one "
                                   "server (agentrl/engine/coalesce.py); 0: off; not behind a router")  # fmt: skip
    batch_max_wait_ms: float = Field(50.0, gt=0, description="the longest a call waits to leave")
    max_restarts: int = Field(
        3, ge=0, description="restarts of one server we started (died or hung) before the run stops"
    )
    placement: Literal["local", "ray"] = Field(
        "local",
        description="where the servers we start run: local = subprocesses of the trainer on "
        "`host`; ray = each started by a small Ray actor on the node Ray picks (see "
        "ray_resources), bound to that node's address (docs/ray_cluster.md)",
    )
    tp: int = Field(
        1,
        ge=1,
        description="sglang: tensor-parallel GPUs per server (--tp-size); placed locally, "
        "server i gets the GPUs i*tp .. i*tp+tp-1 of engine.gpus",
    )
    gpus: list[str] = Field(
        default_factory=list,
        description="sglang, placement=local: the GPU ids the servers share out (server i gets "
        "the i-th tp of them); empty: the visible GPUs, and with engine.colocate=false on a host "
        "with enough GPUs those after the learner's (the learner's ranks take the first ones)",
    )
    ray_num_cpus: float = Field(1.0, ge=0, description="placement=ray: CPUs per server actor")
    ray_num_gpus: float = Field(
        0.0, ge=0, description="placement=ray: GPUs per server actor (sglang: its TP size)"
    )
    ray_resources: dict[str, float] = Field(
        default_factory=dict,
        description="placement=ray: custom Ray resources per server, to pin servers to nodes "
        "started with `ray start --resources='{\"rollout\": 1}'` (e.g. {rollout: 1})",
    )

    @field_validator("gpus", mode="before")
    @classmethod
    def _gpu_ids(cls, gpus: object) -> object:
        """engine.gpus=[0,1] from the command line: ids, kept as CUDA_VISIBLE_DEVICES spells them."""
        return [str(g) for g in gpus] if isinstance(gpus, list | tuple) else gpus

    @field_validator("api_key")
    @classmethod
    def _no_leading_dash(cls, key: str | None) -> str | None:
        if key is not None and (not key.strip() or key.startswith("-") or key != key.strip()):
            raise ValueError("engine.api_key must be non-empty, not start with '-' and carry no "
                             "spaces at its ends (SGLang's and smg's argparse read it)")  # fmt: skip
        return key

    @field_serializer("api_key")
    def _hidden(self, key: str | None) -> str | None:
        """A secret: the tracker's copy of the config shows that one was set, not what."""
        return None if key is None else "<hidden>"

    @field_validator("extra_args", "router_args")
    @classmethod
    def _keys_not_in_args(cls, args: list[str]) -> list[str]:
        """The servers' and the router's keys are engine.api_key: on a command line any local
        user could read them, and SGLang takes one --config file only (agentrl's, holding them)."""
        keys = ("--api-key", "--admin-api-key", "--config", "--control-plane-api-keys")
        for name in (a.partition("=")[0] for a in args):
            if name in keys:
                raise ValueError(f"{name} in engine.extra_args / router_args: agentrl gives the "
                                 "servers and the router engine.api_key; set it (or "
                                 f"${API_KEY_ENV}) instead")  # fmt: skip
        return args

    @field_validator("extra_args")
    @classmethod
    def _one_tokenizer_worker(cls, args: list[str]) -> list[str]:
        """SGLang 0.5.17 with --tokenizer-worker-num > 1: only one worker hears of a weight
        update, so answers carry stale versions (an H100 run read {2, 3, default}, not {3})."""
        value = flag_value(args, "--tokenizer-worker-num")
        if value is not None and value.strip() != "1":
            raise ValueError(f"--tokenizer-worker-num {value}: SGLang's extra tokenizer "
                             "workers do not learn of weight updates, so completions would "
                             "carry stale weight versions; leave it at 1")  # fmt: skip
        return args

    @model_validator(mode="after")
    def _tensor_parallel(self) -> EngineConfig:
        if self.tp > 1 and self.kind != "sglang":
            raise ValueError(f"engine.tp={self.tp}: the dev server has no tensor parallelism")
        if any(
            a.split("=")[0] in ("--tp-size", "--tp", "--tensor-parallel-size")
            for a in self.extra_args
        ):
            raise ValueError(
                "set the servers' tensor parallelism with engine.tp, not --tp-size in "
                "engine.extra_args: the GPUs per server and the weight-update group follow it"
            )
        if self.placement == "ray" and self.tp > 1 and self.ray_num_gpus != self.tp:
            raise ValueError(
                f"engine.tp={self.tp} with engine.placement=ray: set engine.ray_num_gpus="
                f"{self.tp}, the GPUs Ray gives each server's actor"
            )
        return self

    @model_validator(mode="after")
    def _ray_placement(self) -> EngineConfig:
        if self.placement == "ray" and self.urls:
            raise ValueError(
                "engine.placement=ray starts servers, but engine.urls names running ones; "
                "drop engine.urls or use engine.placement=local"
            )
        if self.placement == "ray" and self.kind == "sglang" and not self.ray_num_gpus:
            raise ValueError(
                "engine.placement=ray with engine.kind=sglang: Ray hands an actor only the GPUs "
                "it asks for; set engine.ray_num_gpus to each server's GPU count (its TP size)"
            )
        if self.placement == "ray" and self.colocate:
            raise ValueError(
                "engine.colocate=true shares the learner's GPUs on this host; it needs "
                "engine.placement=local"
            )
        return self

    def token(self) -> str:
        """The Bearer token the servers take and the client sends: `api_key`, else
        $AGENTRL_ENGINE_API_KEY, else this process's random run token."""
        return self.api_key or default_api_key()

    def running_cap(self) -> list[str]:
        """SGLang's `--max-running-requests` at its decode CUDA graph's batch, where extra_args
        set neither (nor turned graphs off): SGLang's own cap is what its KV memory holds, far
        past the graph's batch, and every sequence past the graph's batch decodes without one.
        The graph's batch is --cuda-graph-max-bs(-decode) when given, else SGLang 0.5.17's
        choice on a GPU of 60-160 GiB (H100, H200): 256 below TP 4, 512 from TP 4. The episodes
        past the cap wait in SGLang's queue, prefilled as soon as a slot frees (over-subscription).
        One H200, random 0.5B, 512 episodes of 4 x 128-token turns: 19.0k tok/s uncapped, 41.2k
        capped at 256 (bench/rollout_throughput.py; docs/benchmarks.md)."""
        args = self.extra_args
        names = {a.partition("=")[0] for a in args}
        if self.kind != "sglang" or names & {
            "--max-running-requests", "--disable-cuda-graph", "--cuda-graph-config",
            "--cuda-graph-bs", "--cuda-graph-bs-decode",
        }:  # fmt: skip
            return []
        graph = flag_value(args, "--cuda-graph-max-bs", "--cuda-graph-max-bs-decode")
        if graph is not None:
            return ["--max-running-requests", graph]
        return ["--max-running-requests", "512" if self.tp >= 4 else "256"]

    def server_urls(self) -> list[str]:
        if self.urls:
            return list(self.urls)
        return [f"http://{self.host}:{self.base_port + i}" for i in range(self.num_servers)]
