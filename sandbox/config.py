"""Typed settings of the sandbox: per-execution limits, the local service, and the client side.

`SandboxConfig` is what the python tool and the trainer read (`sandbox.make_sandbox(cfg)`);
`ServerConfig` is what `python -m agentrl.sandbox.server` runs with (also nested in `SandboxConfig.server`
for a service the trainer starts itself).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator


class Limits(BaseModel):
    """Limits of one execution (one-shot run or one call of a session)."""

    model_config = ConfigDict(extra="forbid")

    wall_s: float = Field(10.0, gt=0, description="default wall time when the caller gives none")
    max_wall_s: float = Field(120.0, gt=0, description="upper bound on any caller's timeout")
    cpu_s: float = Field(10.0, gt=0, description="CPU seconds per call (per process)")
    session_cpu_s: float = Field(600.0, gt=0, description="CPU seconds over a session's life")
    memory_mb: int = Field(1024, gt=16, description="resident memory of the whole sandbox")
    processes: int = Field(64, gt=1, description="processes + threads of the whole sandbox")
    file_size_mb: int = Field(16, gt=0, description="largest file the code may write")
    tmp_mb: int = Field(64, gt=0, description="size of the private writable /tmp (and /dev/shm)")
    open_files: int = Field(256, gt=16)
    output_bytes: int = Field(64 * 1024, gt=0, description="stdout/stderr kept per stream")
    output_kill_bytes: int = Field(8 << 20, gt=0, description="output that stops the run")


class ServerConfig(BaseModel):
    """The local sandbox service (`python -m agentrl.sandbox.server`)."""

    model_config = ConfigDict(extra="forbid")

    host: str = "127.0.0.1"
    port: int = 8470
    limits: Limits = Field(default_factory=Limits)
    isolation: Literal["auto", "bwrap", "rlimits"] = Field(
        "auto", description="auto: bwrap namespaces when they work here, else rlimits (logged)"
    )
    warm_workers: int = Field(4, ge=0, description="pre-started interpreters waiting for code")
    max_running: int = Field(
        512,
        ge=1,
        description="the policy's one-shot calls running at once, as many session calls, and "
        "as many grader calls (each kind apart, with a queue of its own: sandbox/admission.py; "
        "so neither sessions nor a flood of stateless tool calls make a reward's call busy). A "
        "sleeping call holds one, so keep "
        "it far above the CPU count: the kernel shares the CPUs, the service cgroup caps memory "
        "and processes. A trainer's service needs it >= max_sessions (full_load_problem)",
    )
    max_queue: int = Field(
        256, ge=0, description="calls of each kind waiting for a slot; beyond: 503 busy"
    )
    max_queue_wait_s: float = Field(
        20.0, gt=0, description="a call that waited this long for a slot gets 503 busy (not run)"
    )
    service_memory_mb: int | None = Field(
        None, gt=64, description="memory of all sandboxes together (cgroup); None: half the host's"
    )
    service_processes: int = Field(4096, gt=1, description="tasks of all sandboxes together")
    max_sessions: int = Field(512, ge=0)
    session_ttl_s: float = Field(900.0, gt=0, description="idle lease of a session")
    max_code_bytes: int = Field(1 << 20, gt=0)
    images: dict[str, str] = Field(
        default_factory=dict,
        description="name -> a root filesystem (directory or tarball) a call may run in: "
        "run(image=name) (sandbox/images.py; bwrap isolation only)",
    )
    image_warm_workers: int = Field(1, ge=0, description="pre-started workers per image")
    python: str | None = Field(None, description="interpreter inside the sandbox (default: ours)")
    preload: list[str] = Field(
        default_factory=list, description="modules imported by warm workers (e.g. numpy)"
    )
    ro_paths: list[str] = Field(default_factory=list, description="extra read-only host paths")
    env: dict[str, str] = Field(default_factory=dict, description="extra variables inside")
    seccomp: bool = True
    cgroups: bool = True
    uid_base: int | None = Field(
        None,
        description="first host uid of per-worker users (root only); None: one range per "
        "service instance (from its pid), so two services never share per-uid limits",
    )
    token: str | None = Field(
        None,
        description="if set, required as Bearer token / X-API-Key on every route but /health; a "
        "service the trainer starts itself gets a random one per run",
    )
    e2b_timeout_s: float = Field(60.0, gt=0, description="default wall time of e2b /execute")
    e2b_max_sandboxes: int = Field(
        64, ge=1, description="live e2b sandboxes; beyond: 429 (kill one, or wait for a timeout)"
    )
    e2b_max_contexts: int = Field(
        16, ge=1, description="code contexts of one e2b sandbox (each its own session); beyond: 429"
    )

    def full_load_problem(self) -> str | None:
        """Why an honest full load could be answered busy here, else None.

        A session runs one call at a time (its lock is taken before a slot), so with
        `max_running >= max_sessions` no session call ever waits for another session's call. With
        fewer slots, sessions whose calls honestly run long (sleeps, slow tests: up to
        `max_wall_s`, 120 s) hold every slot, and the next session's call is answered busy after
        `max_queue_wait_s` (20 s): the trainer reads that as `sandbox_unavailable`, an outage,
        although nothing is wrong but load. Raising `max_queue_wait_s` past `max_wall_s` instead
        would not do: the client's read timeout (`CALL_MARGIN_S` past the call's own) comes
        first, and a wait that long no longer tells a stuck service from a busy one. A slot costs
        nothing until a call runs (the session's interpreter is alive either way; the service
        cgroup caps memory and processes, the kernel shares the CPUs), so the flood guards stay:
        `max_sessions`, `max_queue` and the queue wait, which one-shot calls still meet."""
        if self.max_running >= self.max_sessions:
            return None
        return (
            f"sandbox.server.max_running={self.max_running} is below max_sessions="
            f"{self.max_sessions}: at full load, sessions whose calls honestly run long hold "
            f"every slot and another session's call is answered busy after max_queue_wait_s="
            f"{self.max_queue_wait_s:g}s (sandbox_unavailable, though nothing failed). Set "
            f"max_running >= max_sessions (a slot costs nothing until used), or lower max_sessions"
        )


class E2BConfig(BaseModel):
    """e2b backend. The API key and endpoints come from the environment as e2b users expect
    (E2B_API_KEY, E2B_DOMAIN, E2B_API_URL, E2B_SANDBOX_URL) unless given here."""

    model_config = ConfigDict(extra="forbid")

    template: str | None = None
    api_key: str | None = None
    domain: str | None = None
    sandbox_timeout_s: int = Field(600, gt=0, description="lifetime of each e2b sandbox")
    request_timeout_s: float = Field(30.0, gt=0)


class SandboxConfig(BaseModel):
    """Which sandbox the python tool uses. `backend="service"` with no `url` starts a local
    service (with `server`) owned by the returned client; it stops on `aclose()`."""

    model_config = ConfigDict(extra="forbid")

    backend: str = Field(
        "service",
        description="service (isolated, the default) | subprocess (rlimits only) | e2b, or an import path module:factory (backends.py)",
    )
    url: str | None = Field(None, description="service URL, e.g. http://127.0.0.1:8470")
    token: str | None = Field(None, description="the token of the service at `url`")
    retries: int = Field(5, ge=0, description="retries on unreachable / busy / 5xx")
    backoff_s: float = Field(0.25, gt=0, description="first retry wait; doubles, with jitter")
    backoff_max_s: float = Field(4.0, gt=0)
    max_concurrency: int = Field(256, ge=1, description="client-side cap on calls in flight")
    max_restarts: int = Field(
        3, ge=0, description="restarts of a service this client started, if it dies, per run"
    )
    limits: Limits = Field(default_factory=Limits, description="subprocess backend limits")
    server: ServerConfig = Field(default_factory=ServerConfig)
    e2b: E2BConfig = Field(default_factory=E2BConfig)

    @model_validator(mode="after")
    def _full_load_never_busy(self) -> SandboxConfig:
        """The service a run starts must answer an honest full load (ServerConfig.
        full_load_problem); a service given by `url` is its owner's to size."""
        problem = self.server.full_load_problem()
        if self.backend == "service" and self.url is None and problem is not None:
            raise ValueError(problem)
        return self
