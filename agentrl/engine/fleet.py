"""Start and stop rollout servers from config: dev servers (CPU) or SGLang, on loopback by default.

    with launch_engines(cfg.engine, model_path, log_dir) as urls:
        async with EngineClient(urls) as engine: ...

With `engine.urls` set, no engine is started: the servers are the user's, and we only wait for
them to be healthy. A router in front of them: agentrl/engine/router.py. Every process we start
gets its own process group and is stopped (SIGTERM, then SIGKILL) when the block exits, also on
errors and Ctrl-C; one that dies during start-up is reported with the tail of its log (one that
lost a start race, `LOAD_RACE` or `PORT_RACE`, is started again first).

With `engine.placement=ray` each server is started instead by a `ServerActor` on the node Ray
picks (`engine.ray_num_cpus` / `ray_num_gpus` / `ray_resources`), bound to that node's address;
the actor stops its process group and restarts it on the same port (docs/ray_cluster.md).

Every server we start takes the run's token (`engine.api_key`, else this process's random one:
`EngineConfig.token()`) and refuses a request without `Authorization: Bearer <token>` with 401;
/health stays open. The token stays off their command lines, which any local user can read
(/proc/PID/cmdline): SGLang reads `--api-key` and `--admin-api-key` (its weight, memory, pause and
LoRA routes take the admin key) from a 0600 `--config` YAML beside its log; the dev server reads
$AGENTRL_ENGINE_API_KEY. Logs are 0600 too: SGLang logs its arguments.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

import httpx

from agentrl.engine.checks import before_launch
from agentrl.engine.config import API_KEY_ENV, EngineConfig
from agentrl.engine.gpus import own_gpus
from agentrl.engine.http import health_probe
from agentrl.engine.protocol import EngineUnavailable
from agentrl.sandbox.base import die_with_parent

log = logging.getLogger(__name__)
# Start races a local server can lose, answered by another start (twice at most): SGLang counts
# memory another process took during its weight load as weights (same port again); another process
# bound our picked port first (a new one: no one has the URL before `wait` returns)
LOAD_RACE, PORT_RACE = "leave no GPU memory for the KV cache", "address already in use"
RACE_STARTS, RESTART_MARK = 2, "---- restarted by agentrl at"


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def server_command(
    cfg: EngineConfig, model_path: Path, port: int, key_file: Path | None = None
) -> list[str]:
    """The launch command; SGLang's keys come from `key_file` (`write_key_file`), the dev
    server's from its environment (`server_env`)."""
    if cfg.kind == "dev":
        return [sys.executable, "-m", "agentrl.engine.dev", "--model", str(model_path),
                "--host", cfg.host, "--port", str(port), "--device", cfg.device, *cfg.extra_args]  # fmt: skip
    tp = ["--tp-size", str(cfg.tp)] if cfg.tp > 1 else []
    keys = ["--config", str(key_file)] if key_file is not None else []
    return [sys.executable, "-m", "sglang.launch_server", "--model-path", str(model_path),
            "--host", cfg.host, "--port", str(port), "--skip-tokenizer-init", *tp, *keys,
            *cfg.extra_args, *cfg.running_cap()]  # fmt: skip


def write_key_file(path: Path, token: str) -> Path:
    """SGLang's `--config` YAML with the run's token as its API key and admin API key (both:
    with an admin key set, its admin routes take only that one; sglang/srt/utils/auth.py),
    readable by this user alone. JSON strings are YAML strings: the token stays a string."""
    path.unlink(missing_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(f"api-key: {json.dumps(token)}\nadmin-api-key: {json.dumps(token)}\n")
    return path


def _key_file(log_path: Path) -> Path:
    return log_path.with_name(f".{log_path.stem}.keys.yaml")


def private_log(path: Path, mode: str):
    """`path` opened for writing (mode w or a), readable by this user alone: SGLang logs its
    arguments, the key among them."""
    f = open(path, mode, opener=lambda p, flags: os.open(p, flags, 0o600))  # noqa: SIM115
    os.fchmod(f.fileno(), 0o600)  # a log an older run left readable
    return f


def server_env(cfg: EngineConfig, index: int) -> dict[str, str]:
    """Loopback-only collectives for a server on loopback; SGLang server i gets GPUs
    i*tp .. i*tp+tp-1 of engine.gpus, else of the visible ones (several servers or TP on one host;
    placed by Ray, the GPUs Ray gave its actor)."""
    env = dict(os.environ)
    # gloo/NCCL bind their own listening sockets to the hostname's interface unless told
    # otherwise; on a real node's address `lo` would be wrong: the user's choice (or none) holds
    if _loopback_host(cfg.host):
        env.setdefault("GLOO_SOCKET_IFNAME", "lo")
        env.setdefault("NCCL_SOCKET_IFNAME", "lo")
    # SGLang's /health generates a token unless told not to: on a server whose memory is released
    # (colocated, while the learner works) that crashes its scheduler, and smg probes /health
    # every 2 s. /health stays a liveness probe; a hang is found with /health_generate
    # (Fleet.down(deep=True)) at times the server holds its memory.
    if cfg.kind == "sglang":
        env["SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION"] = "0"
        env.pop(API_KEY_ENV, None)  # its keys are in its --config file
    else:
        env[API_KEY_ENV] = cfg.token()
    several = cfg.num_servers > 1 or cfg.tp > 1
    if cfg.kind == "sglang" and (several or cfg.gpus) and cfg.placement == "local":
        env["CUDA_VISIBLE_DEVICES"] = ",".join(own_gpus(cfg, index, env))
    return env


def auth_headers(cfg: EngineConfig) -> dict[str, str]:
    return {"Authorization": f"Bearer {cfg.token()}"}


def _loopback_host(host: str) -> bool:
    return host in ("localhost", "::1") or host.startswith("127.")


def _popen(cfg: EngineConfig, model_path: Path, index: int, port: int, log_path: Path,
           mode: str) -> subprocess.Popen:  # fmt: skip
    """Start server `index` on `cfg.host:port`, its output appended to (mode a) or written over
    (w) `log_path`, in its own process group, dying with this process."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    key_file = None
    if cfg.kind == "sglang":
        key_file = write_key_file(_key_file(log_path), cfg.token())
    with private_log(log_path, mode) as out:
        if mode == "a":
            out.write(f"\n{RESTART_MARK} {time.strftime('%H:%M:%S')} ----\n")
            out.flush()
        return subprocess.Popen(
            server_command(cfg, model_path, port, key_file),
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env=server_env(cfg, index),
            preexec_fn=die_with_parent,  # a SIGKILLed trainer (or Ray actor) leaves no server
        )


class ServerActor:
    """engine.placement=ray: a Ray actor that starts one rollout server on its node, bound to
    the node's address (not loopback unless the node's address is), and stops its process group.
    Plain class; `RayServer` wraps it with `ray.remote`. The log is written on that node."""

    def __init__(self, cfg: EngineConfig, model_path: str, index: int, log_path: str) -> None:
        self.cfg, self.model_path, self.index = cfg, Path(model_path), index
        self.log_path = Path(log_path)
        self.proc: subprocess.Popen | None = None

    def start(self, port: int | None, mode: str) -> str:
        import ray

        ip = ray.util.get_node_ip_address()
        cfg = self.cfg.model_copy(update={"host": ip})
        port = port or free_port(ip)
        self.proc = _popen(cfg, self.model_path, self.index, port, self.log_path, mode)
        return f"http://{ip}:{port}"

    def node_id(self) -> str:
        import ray

        return ray.get_runtime_context().get_node_id()

    def poll(self) -> int | None:
        return self.proc.poll() if self.proc else None

    def tail(self, n: int = 2000) -> str:
        try:
            return self.log_path.read_text()[-n:]
        except OSError as e:
            return f"(no log: {e})"

    def stop(self, grace_s: float) -> None:
        if self.proc is not None:
            stop_processes([self.proc], grace_s)
            _signal_group(self.proc, signal.SIGKILL)  # what is left of the group
        _key_file(self.log_path).unlink(missing_ok=True)


class RayServer:
    """The driver's handle on a `ServerActor`: `poll()` and `returncode` as a Popen's."""

    def __init__(self, cfg: EngineConfig, model_path: Path, index: int, log_path: Path) -> None:
        import ray

        self._ray = ray
        self.returncode: int | None = None
        # the token this process resolved, not the actor's own process's
        cfg = cfg.model_copy(update={"api_key": cfg.token()})
        self.actor = (
            ray.remote(ServerActor)
            .options(
                num_cpus=cfg.ray_num_cpus,
                num_gpus=cfg.ray_num_gpus,
                resources=cfg.ray_resources or None,
                max_restarts=0,
            )  # fmt: skip
            .remote(cfg, str(model_path), index, str(log_path))
        )
        self.what = (
            f"a Ray actor for rollout server {index} ({{CPU: {cfg.ray_num_cpus:g}, GPU: "
            f"{cfg.ray_num_gpus:g}}} + engine.ray_resources={cfg.ray_resources})"
        )

    def start(self, port: int | None, mode: str, timeout_s: float) -> str:
        ray = self._ray
        try:
            return ray.get(self.actor.start.remote(port, mode), timeout=timeout_s)
        except ray.exceptions.GetTimeoutError:
            raise EngineUnavailable(
                f"Ray did not place {self.what} within {timeout_s:g}s; free now: "
                f"{ray.available_resources()}. Start nodes with those resources (`ray start "
                "--resources=...`) or change engine.ray_num_cpus / ray_num_gpus / ray_resources"
            ) from None
        except ray.exceptions.RayError as e:
            raise EngineUnavailable(f"{self.what} failed to start its server: {e}") from e

    def poll(self) -> int | None:
        if self.returncode is None:
            try:
                self.returncode = self._ray.get(self.actor.poll.remote(), timeout=30)
            except self._ray.exceptions.RayError:  # the actor (or its node) is gone
                self.returncode = -1
        return self.returncode

    def tail(self) -> str:
        try:
            return self._ray.get(self.actor.tail.remote(), timeout=30)
        except self._ray.exceptions.RayError as e:
            return f"(its actor is gone: {type(e).__name__})"

    def stop(self, grace_s: float = 15.0) -> bool:
        """Stop the server; False when its actor (or node) is gone."""
        try:
            self._ray.get(self.actor.stop.remote(grace_s), timeout=grace_s + 15)
        except self._ray.exceptions.RayError:
            return False
        self.returncode = None
        return True

    def kill(self) -> None:
        self.stop()
        self._ray.kill(self.actor)


Server = subprocess.Popen | RayServer


def _tail(proc: Server | None, path: Path | None) -> str:
    if isinstance(proc, RayServer):
        return proc.tail()
    return path.read_text()[-2000:] if path else ""


class Fleet:
    """The rollout servers this run started (none when `engine.urls` names the user's own), and
    their restarts: `down()` finds servers whose process exited or that stopped answering
    /health; `restart(urls)` starts each again on its own port, with the model it started with
    (the caller then pushes the current weights), at most `engine.max_restarts` times per server
    before it gives up with the server's log tail."""

    def __init__(self, cfg: EngineConfig, model_path: Path, log_dir: Path) -> None:
        self.cfg, self.model_path, self.log_dir = cfg, model_path, log_dir
        self.urls: list[str] = []
        self.procs: list[Server] = []  # engine.placement=ray: handles on Ray actors
        self.logs: list[Path] = []  # placed by Ray: the path on the server's node
        self.restarts: dict[str, int] = {}
        # one client for the per-step /health checks: httpx.get builds a TLS context (25 ms) a call
        self._http: httpx.Client | None = None

    @property
    def owned(self) -> bool:
        return bool(self.procs)

    @property
    def gpus(self) -> list[list[str]] | None:
        """Per server, the GPU ids it computes on: SGLang servers started on this host."""
        if not self.owned or self.cfg.kind != "sglang" or self.cfg.placement != "local":
            return None
        return [own_gpus(self.cfg, i) for i in range(self.cfg.num_servers)]

    def start(self) -> None:
        self.spawn()
        self.wait()

    def wait(self) -> None:
        """Until every server answers /health (or one exits: its log tail is the error). A local
        server that lost a start race (`LOAD_RACE`, `PORT_RACE`) is started again first."""
        for attempt in range(RACE_STARTS + 1):
            try:
                return wait_healthy(self.urls, self.procs if self.owned else [],
                                    self.cfg.health_timeout_s, self.logs)  # fmt: skip
            except EngineUnavailable:
                raced = self._lost_races() if attempt < RACE_STARTS else {}
                if not raced:
                    raise
            for i, race in raced.items():
                if race == PORT_RACE:  # no one has the URL yet
                    self.urls[i] = f"http://{self.cfg.host}:{free_port(self.cfg.host)}"
                log.warning("rollout server: a start lost a race (%r in its log); starting it "
                            "again at %s", race, self.urls[i])  # fmt: skip
                self._respawn(i, int(self.urls[i].rsplit(":", 1)[1]))

    def _lost_races(self) -> dict[int, str]:  # local servers that exited on a race this start
        tails = {i: self.logs[i].read_text().rsplit(RESTART_MARK, 1)[-1].lower() for i, p in
                 enumerate(self.procs) if isinstance(p, subprocess.Popen) and p.poll() is not None}  # fmt: skip
        return {i: r for i, t in tails.items() for r in (LOAD_RACE, PORT_RACE) if r.lower() in t}

    def spawn(self) -> None:
        """Start the servers' processes without waiting for them to load (`wait` does):
        the caller may do other work meanwhile (the run starts its learners)."""
        if self.cfg.urls:
            self.urls = list(self.cfg.urls)
            return
        if self.cfg.kind == "sglang":
            before_launch(self.model_path, self.cfg.placement)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        for i in range(self.cfg.num_servers):
            self.logs.append(self.log_dir / f"{self.cfg.kind}-server-{i}.log")
            if self.cfg.placement == "ray":
                proc = RayServer(self.cfg, self.model_path, i, self.logs[i])
                self.procs.append(proc)
                self.urls.append(proc.start(None, "w", self.cfg.health_timeout_s))
                continue
            port = free_port(self.cfg.host)
            self.urls.append(f"http://{self.cfg.host}:{port}")
            self.procs.append(_popen(self.cfg, self.model_path, i, port, self.logs[i], "w"))

    def _respawn(self, i: int, port: int) -> None:
        proc = self.procs[i]
        if isinstance(proc, RayServer):  # same node, same port: the URL stays valid
            if not proc.stop(grace_s=5.0):
                raise EngineUnavailable(
                    f"rollout server {self.urls[i]}: its Ray actor (or node) is gone; it cannot "
                    "be restarted on another node under the same URL. Restart the run"
                )
            proc.start(port, "a", self.cfg.health_timeout_s)
            return
        stop_processes([proc], grace_s=5.0)  # a hung one
        _signal_group(proc, signal.SIGKILL)  # what is left of a dead one's group
        self.procs[i] = _popen(self.cfg, self.model_path, i, port, self.logs[i], "a")

    def down(self, deep: bool = False, timeout_s: float = 5.0) -> list[str]:
        """Servers we started whose process exited, or that did not answer their health probe
        (`engine.health_probe`: `deep` only while they hold their memory) in time."""
        path, timeout_s = health_probe(deep, timeout_s)
        out = []
        for url, proc in zip(self.urls, self.procs, strict=False):
            if proc.poll() is not None:
                out.append(url)
                continue
            if self._http is None:
                self._http = httpx.Client(headers=auth_headers(self.cfg))
            try:
                ok = self._http.get(url + path, timeout=timeout_s).status_code == 200
            except httpx.HTTPError:
                ok = False
            if not ok:
                out.append(url)
        return out

    def restart(self, urls: list[str]) -> None:
        for url in urls:
            i = self.urls.index(url)
            n = self.restarts.get(url, 0) + 1
            if n > self.cfg.max_restarts:
                raise EngineUnavailable(
                    f"rollout server {url} failed again after {self.cfg.max_restarts} restarts "
                    f"(engine.max_restarts); its log ({self.logs[i]}) ends with:\n"
                    f"{_tail(self.procs[i], self.logs[i])}"
                )
            self.restarts[url] = n
            self._respawn(i, int(url.rsplit(":", 1)[1]))
        idx = [self.urls.index(u) for u in urls]
        wait_healthy([self.urls[i] for i in idx], [self.procs[i] for i in idx],
                     self.cfg.health_timeout_s, [self.logs[i] for i in idx])  # fmt: skip

    def stop(self) -> None:
        if self._http is not None:
            self._http.close()
            self._http = None
        stop_processes([p for p in self.procs if isinstance(p, subprocess.Popen)])
        for p in self.procs:
            if isinstance(p, RayServer):
                p.kill()  # its actor removes its key file
        if self.cfg.placement == "local":
            for path in self.logs:
                _key_file(path).unlink(missing_ok=True)


@contextmanager
def launch_fleet(
    cfg: EngineConfig, model_path: Path, log_dir: Path, wait: bool = True
) -> Iterator[Fleet]:
    """The fleet, started (with `wait=False` its servers may still be loading: call
    `fleet.wait()`), stopped on exit."""
    fleet = Fleet(cfg, model_path, log_dir)
    try:
        fleet.spawn()
        if wait:
            fleet.wait()
        yield fleet
    finally:
        fleet.stop()


@contextmanager
def launch_engines(cfg: EngineConfig, model_path: Path, log_dir: Path) -> Iterator[list[str]]:
    """The servers' URLs, for callers that need no restarts."""
    with launch_fleet(cfg, model_path, log_dir) as fleet:
        yield fleet.urls


def wait_healthy(urls: list[str], procs: list[Server], timeout_s: float, logs: list[Path]) -> None:
    deadline = time.monotonic() + timeout_s
    pending = set(range(len(urls)))
    with httpx.Client() as http:  # one for the whole poll: httpx.get builds a TLS context a call
        while pending:
            for i in sorted(pending):
                if procs and procs[i].poll() is not None:
                    tail = _tail(procs[i], logs[i] if logs else None)
                    raise EngineUnavailable(
                        f"rollout server {urls[i]} exited with code {procs[i].returncode} during "
                        f"start-up; its log ({logs[i] if logs else '-'}) ends with:\n{tail}"
                    )
                try:
                    if http.get(urls[i] + "/health", timeout=2.0).status_code == 200:
                        pending.discard(i)
                except httpx.HTTPError:
                    pass
            if pending and time.monotonic() > deadline:
                raise EngineUnavailable(
                    f"rollout servers {[urls[i] for i in sorted(pending)]} not healthy after "
                    f"{timeout_s:g}s; check the server logs or raise engine.health_timeout_s"
                )
            if pending:
                time.sleep(0.25)


def stop_processes(procs: list[subprocess.Popen], grace_s: float = 15.0) -> None:
    for p in procs:
        if p.poll() is None:
            _signal_group(p, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    for p in procs:
        try:
            p.wait(timeout=max(deadline - time.monotonic(), 0.1))
        except subprocess.TimeoutExpired:
            _signal_group(p, signal.SIGKILL)
            p.wait()


def _signal_group(p: subprocess.Popen, sig: int) -> None:
    with suppress(ProcessLookupError):
        os.killpg(p.pid, sig)
