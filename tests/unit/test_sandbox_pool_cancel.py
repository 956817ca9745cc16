"""A worker's start belongs to the pool: a caller that gives up during it (the service's client
went away while the pool was empty on a busy host) leaves the started worker to the next
caller, and leaks no slot and no live process (agentrl/sandbox/pool.py: `spawn`)."""

from __future__ import annotations

import asyncio
import shutil
import sys
import tempfile
import threading
from pathlib import Path

import pytest

from agentrl.sandbox.config import ServerConfig
from agentrl.sandbox.isolation import Launcher, probe_interpreter
from agentrl.sandbox.pool import WorkerPool


class HeldLauncher(Launcher):
    """Starts real workers (rlimits), each once `go` is set, as a start on a busy host waits."""

    def __init__(self, *args, **kw) -> None:
        super().__init__(*args, **kw)
        self.entered, self.go = threading.Event(), threading.Event()
        self.procs: list = []

    def spawn(self, slot, sock_fd):
        self.entered.set()
        assert self.go.wait(30), "the test never let the start go on"
        proc = super().spawn(slot, sock_fd)
        self.procs.append(proc)
        return proc


async def test_a_caller_that_gives_up_during_a_workers_start_leaks_nothing() -> None:
    cfg = ServerConfig(isolation="rlimits", cgroups=False)
    interp = await asyncio.to_thread(probe_interpreter, sys.executable)
    workdir = Path(tempfile.mkdtemp(prefix="agentrl-test-pool-"))
    workdir.chmod(0o755)  # as the service's: a worker's own uid (as root) reaches its home
    launcher = HeldLauncher(cfg, workdir, interp, "rlimits")
    pool = WorkerPool(launcher, cfg.limits, warm=0, cgroups=None, uids=4)
    try:
        call = asyncio.ensure_future(pool.acquire())  # the pool is empty: it starts one
        assert await asyncio.to_thread(launcher.entered.wait, 30)
        call.cancel()  # its client went away during the start
        with pytest.raises(asyncio.CancelledError):
            await call
        launcher.go.set()
        for _ in range(3000):  # the start goes on without its caller, into the warm pool
            if pool.stats()["warm"]:
                break
            await asyncio.sleep(0.01)
        assert pool.stats()["warm"] == 1, "the worker started for the caller that left is lost"
        w = await pool.acquire()  # the next call gets it
        res = await w.execute("print(6 * 7)", "python", 10.0, session=False)
        assert res.stdout == "42\n", res
        assert len(launcher.procs) == 1, "a second worker was started: the first one leaked"
        await pool.release(w)
        await pool.close()
        assert len(pool.slots) == 4, "a slot was never given back"
        assert all(p.poll() is not None for p in launcher.procs), "a worker is still alive"
    finally:
        launcher.go.set()
        for p in launcher.procs:
            p.kill()
        shutil.rmtree(workdir, ignore_errors=True)
