"""Shared fixtures: the tiny model, free loopback ports, and a real dev server on loopback.

The suite runs in two pytest-xdist workers, a test file on one (pyproject's addopts): session
fixtures start once per worker, so ports are always picked free and nothing is written to a fixed
path; builds into $AGENTRL_CACHE are renamed into place (agentrl.assets.build), race-free.

`devserver` (session) is one `python -m agentrl.engine.dev` on 127.0.0.1 serving the tiny random
model; tests must not change its weights (start your own with `launch_devserver` for that).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path

import httpx
import pytest

ROOT = Path(__file__).resolve().parents[1]
# Builds (tokenizer, tiny model) are cached here across runs unless the caller chose a place.
os.environ.setdefault("AGENTRL_CACHE", str(ROOT / ".cache" / "agentrl"))


def pytest_configure(config: pytest.Config) -> None:
    """An xdist worker (addopts: -n 2) runs torch on one thread: two workers with a thread per
    core each would spin against each other (and the servers) on a 2-core machine."""
    if hasattr(config, "workerinput"):
        import torch

        torch.set_num_threads(1)


# The slowest files first (seconds of test time under `-n 2` on a 2-core machine, 2026-11-28),
# so that the two workers finish together: xdist hands out whole files in this order
# (addopts: --dist loadfile --no-loadscope-reorder). A file not listed keeps its place after
# these. Refresh from `pytest -q --durations=0` when a file grows past the last one here.
# (tests/gpu orders its own tests by each one's seconds: tests/gpu/conftest.py)
SLOWEST_FIRST = (
    "test_learning.py", "test_train_engines.py", "test_train.py", "test_train_failures.py",
    "test_learning_envs.py", "test_train_resume.py", "test_learner.py", "test_segments_run.py",
    "test_swe_env.py", "test_empty_steps.py", "test_multinode.py", "test_weight_sync.py",
    "test_gateway.py", "test_sandbox_attacks.py",
)  # fmt: skip


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    def rank(item: pytest.Item) -> int:
        name = item.path.name
        return SLOWEST_FIRST.index(name) if name in SLOWEST_FIRST else len(SLOWEST_FIRST)

    items.sort(key=rank)  # stable: every other file, and each file's tests, keep their order


def find_free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def run_devserver(model: Path | str, *args: str, log_dir: Path, timeout_s: float = 120.0):
    """Start `python -m agentrl.engine.dev` on a free loopback port; yield (url, process).

    One torch thread (CI machines are small and shared). A start whose port another process
    (another xdist worker's server) bound first is made again on a new port, twice at most.
    Stopped with SIGTERM (then SIGKILL after 15 s) when the block exits."""
    for attempt in range(3):
        port = find_free_port()
        log_path = Path(log_dir) / f"devserver-{port}.log"
        cmd = [sys.executable, "-m", "agentrl.engine.dev", "--model", str(model),
               "--host", "127.0.0.1", "--port", str(port), "--threads", "1", *args]  # fmt: skip
        with open(log_path, "w") as log:
            proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)
        url = f"http://127.0.0.1:{port}"
        try:
            if _wait_devserver(url, proc, log_path, timeout_s, last=attempt == 2):
                break
        except BaseException:
            _stop_devserver(proc)
            raise
    try:
        yield url, proc
    finally:
        _stop_devserver(proc)


def _wait_devserver(url: str, proc: subprocess.Popen, log_path: Path, timeout_s: float,
                    last: bool) -> bool:  # fmt: skip
    """True once healthy; False if it lost its port to another process (and `last` is not set)."""
    deadline = time.monotonic() + timeout_s
    while True:
        if proc.poll() is not None:
            from agentrl.engine.fleet import PORT_RACE  # after AGENTRL_CACHE is set

            if not last and PORT_RACE in log_path.read_text().lower():
                return False
            raise RuntimeError(f"devserver exited ({proc.returncode}):\n{log_path.read_text()}")
        try:
            if httpx.get(url + "/health", timeout=1.0).status_code == 200 and _ours(url, proc):
                return True
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"devserver not healthy in {timeout_s}s:\n{log_path.read_text()}")
        time.sleep(0.2)


def _ours(url: str, proc: subprocess.Popen) -> bool:
    """Whether `proc` itself listens on `url`'s port: another process that bound the port first
    answers /health while ours still loads its weights, and ours then exits on the bind (a CI
    run's session-wide server was such a stranger, gone a few tests later)."""
    from agentrl.learner.ray_start import listening_sockets

    return f"127.0.0.1:{url.rsplit(':', 1)[1]}" in listening_sockets(proc.pid).values()


def _stop_devserver(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture(scope="session")
def tiny_model_dir() -> Path:
    from agentrl.assets.build import cached_tiny_random

    return cached_tiny_random()


@pytest.fixture
def free_port() -> int:
    return find_free_port()


@pytest.fixture(scope="session")
def launch_devserver(
    tmp_path_factory: pytest.TempPathFactory,
) -> Callable[..., AbstractContextManager]:
    """`with launch_devserver(model_dir, "--scheduler", "dynamic") as (url, proc): ...`"""
    log_dir = tmp_path_factory.mktemp("devserver-logs")

    def launch(model: Path | str, *args: str):
        return run_devserver(model, *args, log_dir=log_dir)

    return launch


@pytest.fixture(scope="session")
def devserver(tiny_model_dir: Path, launch_devserver) -> Iterator[str]:
    """URL of a session-wide dev server serving the tiny model (do not change its weights)."""
    with launch_devserver(tiny_model_dir) as (url, _):
        yield url
