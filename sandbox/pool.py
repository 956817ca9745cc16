"""The warm pool of sandbox workers: each worker gets its own host uid slot and cgroup, and
`warm` of them wait started for code (sandbox/worker.py is one worker)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import subprocess
import time

from agentrl.sandbox.cgroups import CgroupRoot
from agentrl.sandbox.config import Limits
from agentrl.sandbox.isolation import Launcher, Slot
from agentrl.sandbox.worker import Worker, WorkerStartError

log = logging.getLogger(__name__)


class WorkerPool:
    """Starts workers (each with its own uid slot and cgroup) and keeps `warm` of them ready."""

    def __init__(
        self,
        launcher: Launcher,
        lim: Limits,
        warm: int,
        cgroups: CgroupRoot | None,
        uids: int,
        slots: list[Slot] | None = None,
    ) -> None:
        self.launcher, self.lim, self.warm = launcher, lim, warm
        self.cgroups = cgroups
        base = launcher.cfg.uid_base
        if base is None:  # 65536 uids per instance, above the usual system and user ranges
            base = 200_000 + (os.getpid() % 30_000) * 65_536
        use_uids = launcher.root
        # FIFO reuse over many uids: a uid comes back only long after its sandbox died
        # (shared with the service's other pools, images', when given: one uid per live worker)
        self._free = (
            slots
            if slots is not None
            else [Slot(i, base + i if use_uids else None) for i in range(uids)]
        )
        self._ready: asyncio.Queue[Worker] = asyncio.Queue()
        self._refill: asyncio.Task | None = None
        self._spawning: set[asyncio.Task] = set()
        self._wake = asyncio.Event()
        self._closing = False
        self.started = 0
        self.spawn_s = 0.0

    @property
    def slots(self) -> list[Slot]:
        """The free worker slots (a pool built with `slots=` shares them)."""
        return self._free

    def start(self) -> None:
        self._refill = asyncio.create_task(self._refill_loop())
        self._wake.set()

    async def acquire(self) -> Worker:
        """A ready worker: from the warm pool, or started now if the pool is empty."""
        while not self._ready.empty():
            w = self._ready.get_nowait()
            self._wake.set()
            if w.alive:
                return w
            await self.release(w)
        self._wake.set()
        return await self.spawn()

    async def spawn(self) -> Worker:
        """A newly started worker. The start is the pool's, not the caller's: a caller that
        gives up during it (its client went away, an episode dropped or its tool's deadline
        passed, while the pool was empty on a busy host and a start took seconds) leaves the
        worker to the warm pool. Cancelled half way, the start leaked its slot, its cgroup and
        a live worker that nothing would kill, and the next caller started another."""
        start = asyncio.ensure_future(self._start())
        try:
            return await asyncio.shield(start)
        except asyncio.CancelledError:
            keep = asyncio.create_task(self._keep(start))
            self._spawning.add(keep)  # close() waits for it; the refill counts it as warm
            keep.add_done_callback(self._spawning.discard)
            raise

    async def _keep(self, start: asyncio.Future) -> None:
        """The worker started for a caller that gave up: warm for the next one."""
        try:
            w = await start
        except WorkerStartError:  # the caller would have heard it; nobody is left to
            return
        if self._closing:
            await self.release(w)
        else:
            self._ready.put_nowait(w)

    async def _start(self) -> Worker:
        if not self._free:
            raise WorkerStartError("no free worker slots (raise max_sessions/max_running?)")
        slot = self._free.pop(0)
        t0 = time.monotonic()
        if self.cgroups is not None:
            slot.cgroup = await asyncio.to_thread(
                self.cgroups.create,
                f"w{slot.index}-{self.started}",
                self.lim.memory_mb << 20,
                self.lim.processes + 4,
            )
        parent, child = socket.socketpair()
        try:
            proc = await asyncio.to_thread(self.launcher.spawn, slot, child.fileno())
        except Exception as e:
            parent.close()
            await self._free_slot(slot)
            raise WorkerStartError(f"could not start a sandbox worker: {e}") from e
        finally:
            child.close()
        self.started += 1
        w = Worker(proc, slot, parent, self.lim)
        try:
            warnings = await w.attach(start_timeout=30.0)
        except (WorkerStartError, TimeoutError) as e:
            err = w.err.text()[0][-2000:]
            await self.release(w)
            raise WorkerStartError(f"sandbox worker failed to start: {e}; stderr: {err}") from e
        for msg in warnings:
            log.warning("sandbox worker: %s", msg)
        self.spawn_s += time.monotonic() - t0
        return w

    async def release(self, w: Worker) -> None:
        await w.close()
        slot = w.slot
        if self.launcher.mode != "bwrap" and slot.uid is not None and slot.cgroup is None:
            await asyncio.to_thread(_kill_uid, slot.uid)  # no PID namespace, no cgroup
        await self._free_slot(slot)

    async def _free_slot(self, slot: Slot) -> None:
        if slot.cgroup is not None:
            await asyncio.to_thread(slot.cgroup.remove)
            slot.cgroup = None
        if slot.private_dir is not None:
            await asyncio.to_thread(_rmtree, slot.private_dir)
            slot.private_dir = None
        self._free.append(slot)

    async def _refill_loop(self) -> None:
        parallel = max(1, min(4, os.cpu_count() or 2))
        while not self._closing:
            await self._wake.wait()
            self._wake.clear()
            while (
                not self._closing
                and self._ready.qsize() + len(self._spawning) < self.warm
                and len(self._spawning) < parallel
            ):
                task = asyncio.create_task(self._spawn_warm())
                self._spawning.add(task)
                task.add_done_callback(self._spawning.discard)

    async def _spawn_warm(self) -> None:
        try:
            w = await self.spawn()
        except WorkerStartError as e:
            log.error("%s", e)
            await asyncio.sleep(1.0)
        else:
            if self._closing:
                await self.release(w)
            else:
                self._ready.put_nowait(w)
        finally:
            self._wake.set()

    def stats(self) -> dict:
        return {
            "warm": self._ready.qsize(),
            "started": self.started,
            "free_slots": len(self._free),
            "mean_spawn_ms": round(1000 * self.spawn_s / max(self.started, 1), 1),
        }

    async def close(self) -> None:
        self._closing = True
        self._wake.set()
        if self._refill is not None:
            self._refill.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._refill
        for task in list(self._spawning):
            with contextlib.suppress(asyncio.CancelledError, WorkerStartError):
                await task
        while not self._ready.empty():
            await self.release(self._ready.get_nowait())


def _kill_uid(uid: int) -> None:
    """SIGKILL every process of a worker's own uid: what escaped its process group."""
    subprocess.run(
        ["kill", "-9", "-1"],
        user=uid,
        group=uid,
        extra_groups=[],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        check=False,
    )


def _rmtree(path) -> None:
    import shutil

    shutil.rmtree(path, ignore_errors=True)
