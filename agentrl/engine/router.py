"""SGLang's model gateway (`smg`) in front of the rollout servers, from config.

    with launch_engines(cfg.engine, model_path, log_dir) as urls:      # agentrl/engine/fleet.py
        with launch_router(cfg.engine, urls, log_dir) as router:      # None: not wanted / needed
            async with EngineClient(urls, router=router) as engine: ...

The router fronts several servers: /generate goes through it, pinned per episode by consistent
hashing of the routing key (`engine.router`, `engine.router_policy`). It takes the run's token as
the servers do, read from $AGENTRL_ENGINE_API_KEY, never from its command line; its log is 0600.
It runs in its own process group and is stopped when the block exits.
"""

from __future__ import annotations

import importlib.util
import itertools
import logging
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

from agentrl.engine.config import API_KEY_ENV, EngineConfig
from agentrl.engine.fleet import (
    PORT_RACE,
    RACE_STARTS,
    auth_headers,
    free_port,
    private_log,
    stop_processes,
)
from agentrl.engine.protocol import EngineUnavailable
from agentrl.sandbox.base import die_with_parent

log = logging.getLogger(__name__)


def router_wanted(cfg: EngineConfig, n_servers: int) -> bool:
    """`engine.router`: smg asked for (an error when it is not installed), or auto (smg fronts
    more than one server when it is installed; one server needs no router)."""
    installed = importlib.util.find_spec("smg") is not None
    if cfg.router == "smg" and not installed:
        raise EngineUnavailable(
            "engine.router=smg but SGLang's model gateway is not installed: pip install smg "
            "(or engine.router=none: the client balances the servers itself)"
        )
    return cfg.router == "smg" or (cfg.router == "auto" and n_servers > 1 and installed)


# smg takes its key on the command line only; this adds it inside the process, from the
# environment. `--api-key` is both what smg asks of every client (its /generate and, with no
# control-plane keys, its /workers and other admin routes: model_gateway/src/server.rs, build_app)
# and the Bearer it sends the servers
_SMG_MAIN = (
    "import os, sys; from smg.launch_router import launch_router, parse_router_args; "
    f"key = os.environ.pop({API_KEY_ENV!r}); "
    "launch_router(parse_router_args([*sys.argv[1:], '--api-key=' + key]))"
)


def router_command(cfg: EngineConfig, urls: list[str], port: int, log_dir: Path) -> list[str]:
    """smg on loopback in front of `urls`, its key from $AGENTRL_ENGINE_API_KEY (`_SMG_MAIN`).
    Its own retries re-send a request whose server died to another one (sampling is stateless:
    the prompt ids carry the whole episode); the circuit breaker's cool-down is short so a
    restarted server takes work again within seconds."""
    return [sys.executable, "-c", _SMG_MAIN, "--host", cfg.host, "--port", str(port),
            "--worker-urls", *urls, "--policy", cfg.router_policy,
            "--prometheus-host", cfg.host, "--prometheus-port", str(free_port(cfg.host)),
            "--request-timeout-secs", str(int(cfg.timeout_s)),
            "--health-check-interval-secs", "2", "--cb-timeout-duration-secs", "5",
            "--log-dir", str(log_dir), "--log-level", "warn", *cfg.router_args]  # fmt: skip


@contextmanager
def launch_router(cfg: EngineConfig, urls: list[str], log_dir: Path) -> Iterator[str | None]:
    """Start smg in front of `urls` when `router_wanted`; yield its URL (None without one) once
    it lists every server as healthy; stop it on exit."""
    if not router_wanted(cfg, len(urls)):
        yield None
        return
    log_dir.mkdir(parents=True, exist_ok=True)
    (log_dir / "router").mkdir(mode=0o700, exist_ok=True)
    url, proc = _start_router(cfg, urls, log_dir)
    try:
        yield url
    finally:
        stop_processes([proc])


def _start_router(
    cfg: EngineConfig, urls: list[str], log_dir: Path
) -> tuple[str, subprocess.Popen]:
    """smg on a free port, healthy; started again on new ports when another process bound one
    of its ports before it did (`PORT_RACE`), twice at most."""
    log_path = log_dir / "router.log"
    for attempt in itertools.count():
        port = free_port(cfg.host)
        with private_log(log_path, "w") as f:
            proc = subprocess.Popen(
                router_command(cfg, urls, port, log_dir / "router"),
                stdout=f,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=die_with_parent,
                env={**os.environ, API_KEY_ENV: cfg.token()},
            )
        url = f"http://{cfg.host}:{port}"
        try:
            wait_router(url, len(urls), proc, log_path, cfg.health_timeout_s, auth_headers(cfg))
            return url, proc
        except BaseException:
            stop_processes([proc])
            if attempt == RACE_STARTS or PORT_RACE not in log_path.read_text().lower():
                raise
            log.warning("the router lost its port to another process; starting it again")


def wait_router(
    url: str,
    n_servers: int,
    proc: subprocess.Popen,
    log: Path,
    timeout_s: float,
    headers: dict[str, str] | None = None,
) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        if proc.poll() is not None:
            raise EngineUnavailable(
                f"the router (smg) exited with code {proc.returncode} during start-up; its log "
                f"({log}) ends with:\n{log.read_text()[-2000:]}"
            )
        try:
            r = httpx.get(url + "/workers", timeout=2.0, headers=headers)
            workers = r.json().get("workers", [])
            if sum(bool(w.get("is_healthy")) for w in workers) >= n_servers:
                return
        except (httpx.HTTPError, ValueError, AttributeError):
            pass
        if time.monotonic() > deadline:
            raise EngineUnavailable(
                f"the router at {url} did not list {n_servers} healthy servers within "
                f"{timeout_s:g}s; see {log}"
            )
        time.sleep(0.2)
