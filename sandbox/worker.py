"""One sandbox worker: an agent process inside its own sandbox.

A worker is started before code arrives (`agentrl.sandbox.pool.WorkerPool` keeps `warm_workers` ready),
serves one one-shot call and is killed, or serves the calls of one session until it is closed.
Killing the outer bwrap process tears down the sandbox's PID namespace: every process inside
dies.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import json
import logging
import marshal
import os
import secrets
import signal
import socket
import struct
import subprocess
import time
from dataclasses import dataclass, field

from agentrl.sandbox.base import ExecResult
from agentrl.sandbox.config import Limits
from agentrl.sandbox.cpuwatch import CpuWatch, Proc, agent_of, members
from agentrl.sandbox.isolation import Slot

log = logging.getLogger(__name__)

_SIG_LIMIT = {signal.SIGXCPU: "cpu_time", signal.SIGXFSZ: "file_size"}
_DISK_ERRNOS = {errno.EFBIG, errno.ENOSPC, errno.EDQUOT}
_MARKER_GRACE_S = 1.0
_KILL_GRACE_S = 1.0


# The control channel is shared with the code (the agent runs in the code's process), so every
# frame the server reads is untrusted: its length is capped before anything is buffered (frames
# live outside the sandbox's memory cgroup) and every reply field is type- and size-checked. A
# violation kills the worker and the call comes back as an ordinary result that says so.
_MAX_FRAME = 256 * 1024
_MAX_FIELD = 64 * 1024
_REPLY_FIELDS: dict[str, tuple[type, ...]] = {
    "ready": (bool,), "warnings": (list,), "exit_code": (int, type(None)),
    "error_name": (str, type(None)), "error_value": (str, type(None)),
    "result": (str, type(None)), "timed_out": (bool,), "marker_lost": (bool,),
    "limit": (str,), "errno": (int,),
}  # fmt: skip


class ControlViolation(Exception):
    """The code wrote something on the control channel that the agent would not."""


def check_reply(frame: object) -> dict:
    """The frame as a reply dict, or ControlViolation."""
    if not isinstance(frame, dict):
        raise ControlViolation(f"a {type(frame).__name__} frame")
    for key, value in frame.items():
        kinds = _REPLY_FIELDS.get(key)
        if kinds is None:
            raise ControlViolation(f"unknown field {str(key)[:40]!r}")
        if not isinstance(value, kinds) or (key == "exit_code" and isinstance(value, bool)):
            raise ControlViolation(f"field {key!r} of type {type(value).__name__}")
        if isinstance(value, str) and len(value) > _MAX_FIELD:
            raise ControlViolation(f"field {key!r} of {len(value)} characters")
        if key in ("exit_code", "errno") and value is not None and not -(2**31) <= value < 2**31:
            raise ControlViolation(f"{key} out of range")
        if key == "limit" and value != "cpu_time":
            raise ControlViolation(f"limit {str(value)[:40]!r}")
    if "warnings" in frame:
        frame["warnings"] = [str(w)[:1000] for w in frame["warnings"][:20]]
    return frame


class WorkerStartError(RuntimeError):
    """A worker could not be started (the sandbox setup failed on this host)."""


@dataclass
class _Stream:
    """Collects one pipe of the current call: keeps a head, counts all, finds the end marker.

    Past `kill_at` bytes (in a call, or between a session's calls) the pipe is no longer read:
    its writer blocks once the pipe is full, so a flood costs the service nothing until the
    worker is killed (at once in a call; between calls, at the session's next call)."""

    keep: int
    kill_at: int
    buf: bytearray = field(default_factory=bytearray)
    total: int = 0
    carry: bytearray = field(default_factory=bytearray)
    between: int = 0  # bytes written after this call's marker (background work of a session)
    lost: int = 0  # of those, what did not fit the next call's head (it is truncated too)
    marker: bytes | None = None
    found: bool = False  # this call's marker was read (else it may come after the reply)
    tail: bytes = b""
    seen: asyncio.Event = field(default_factory=asyncio.Event)
    overflow: asyncio.Event = field(default_factory=asyncio.Event)
    eof: asyncio.Event = field(default_factory=asyncio.Event)
    transport: asyncio.ReadTransport | None = None

    def begin(self, marker: bytes | None) -> None:
        late = self.marker if not self.found else None  # the last call's, after its reply
        self.buf, self.total, self.marker, self.tail = bytearray(), 0, marker, b""
        self.lost, self.between = max(0, self.between - len(self.carry)), 0
        self.seen.clear()
        self.found = False
        pending, self.carry = bytes(self.carry), bytearray()
        if late:  # a loaded host: it came after the grace, and was shown in this call's output
            pending = pending.replace(late, b"", 1)
        if pending:
            self.feed(pending)

    def end(self) -> None:
        """The call is over (its reply came): what this pipe brings from now on is between
        calls, even if the marker never came (the code moved fd 1 away)."""
        self.seen.set()

    def read(self, on: bool) -> None:
        """Read the pipe (on) or leave what comes in it, blocking its writer once it is full."""
        t = self.transport
        if t is not None and not t.is_closing():
            (t.resume_reading if on else t.pause_reading)()

    def feed(self, chunk: bytes) -> None:
        if self.seen.is_set():  # after this call's marker: the next call's output
            if len(self.carry) < self.keep:
                self.carry += chunk[: self.keep - len(self.carry)]
            self.between += len(chunk)  # counted too: a flood between calls ends the session
            if self.between > self.kill_at:
                self._overflowed()
            return
        if self.marker:
            joined = self.tail + chunk
            i = joined.find(self.marker)
            if i >= 0:
                before = joined[len(self.tail) : i] if i >= len(self.tail) else b""
                if i < len(self.tail):  # the marker started in the previous chunk
                    cut = len(self.tail) - i
                    self.buf = self.buf[: max(0, len(self.buf) - cut)]
                    self.total -= cut
                self._add(before)
                self.seen.set()
                self.found = True
                self.feed(joined[i + len(self.marker) :])
                return
            self.tail = joined[-(len(self.marker) - 1) :] if len(self.marker) > 1 else b""
        self._add(chunk)

    def _overflowed(self) -> None:
        self.overflow.set()
        self.read(False)

    def _add(self, chunk: bytes) -> None:
        room = self.keep - len(self.buf)
        if room > 0:
            self.buf += chunk[:room]
        self.total += len(chunk)
        if self.total > self.kill_at:
            self._overflowed()

    def text(self) -> tuple[str, bool]:
        s = bytes(self.buf).decode("utf-8", "replace").replace("\x00", "\ufffd")
        return s, self.total + self.lost > len(self.buf)


class Worker:
    """A started worker. Use `execute` (one call) and `kill` (always, at the end)."""

    def __init__(self, proc: subprocess.Popen, slot: Slot, sock: socket.socket, lim: Limits):
        self.proc, self.slot, self.lim = proc, slot, lim
        self.sock = sock
        self.out = _Stream(lim.output_bytes, lim.output_kill_bytes)
        self.err = _Stream(lim.output_bytes, lim.output_kill_bytes)
        self.exited = asyncio.get_running_loop().create_future()
        self.created = time.monotonic()
        self.calls = 0
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._tasks: list[asyncio.Task] = []
        self._pidfd: int | None = None
        self.violation: str | None = None  # why the control channel was found forged
        self._agent: Proc | None = None  # the agent's process, whose CPU a call may spend
        # the service killed this sandbox for a service-wide mark it crossed ("memory" or
        # "processes"): the call it ran ends with that limit, as the code's own result
        self.evicted: str | None = None
        # (memory bytes, tasks) when it became ready, before any code: an idle sandbox's floor
        self.idle_usage: tuple[int, int] = (0, 0)

    @property
    def alive(self) -> bool:
        return not self.exited.done()

    async def attach(self, start_timeout: float) -> list[str]:
        """Wire pipes and wait for the agent's `ready` frame; returns its warnings."""
        loop = asyncio.get_running_loop()
        self._reader, self._writer = await asyncio.open_unix_connection(sock=self.sock)
        for pipe, stream in ((self.proc.stdout, self.out), (self.proc.stderr, self.err)):
            self._tasks.append(asyncio.create_task(_pump(loop, pipe, stream)))
        try:
            self._pidfd = os.pidfd_open(self.proc.pid)
            loop.add_reader(self._pidfd, self._on_exit)
        except (AttributeError, OSError):
            self._tasks.append(asyncio.create_task(self._wait_thread()))
        try:
            ready = await asyncio.wait_for(self._recv(), start_timeout)
        except ControlViolation as e:
            raise WorkerStartError(f"worker's first frame was not `ready`: {e}") from None
        if not ready or not ready.get("ready"):
            raise WorkerStartError("worker exited before it was ready")
        cg = self.slot.cgroup
        if cg is not None:
            self.idle_usage = (cg.memory_used(), cg.tasks())
        return ready.get("warnings", [])

    def _on_exit(self) -> None:
        loop = asyncio.get_running_loop()
        if self._pidfd is not None:
            loop.remove_reader(self._pidfd)
            os.close(self._pidfd)
            self._pidfd = None
        if not self.exited.done():
            self.exited.set_result(self.proc.wait())

    async def _wait_thread(self) -> None:
        rc = await asyncio.to_thread(self.proc.wait)
        if not self.exited.done():
            self.exited.set_result(rc)

    async def _recv(self) -> dict | None:
        """The next reply; None when the channel closed; ControlViolation for a forged one."""
        assert self._reader is not None
        try:
            head = await self._reader.readexactly(4)
            size = struct.unpack(">I", head)[0]
            if size > _MAX_FRAME:
                raise ControlViolation(f"a frame of {size} bytes (the agent's are < {_MAX_FRAME})")
            body = await self._reader.readexactly(size)
        except (asyncio.IncompleteReadError, ConnectionError):
            return None
        try:
            return check_reply(json.loads(body))
        except ValueError as e:  # not JSON, or not UTF-8
            raise ControlViolation(f"a frame that is not JSON ({e})") from None

    async def _send(self, obj: dict) -> None:
        assert self._writer is not None
        data = marshal.dumps(obj, 2)  # read by the agent only (sandbox/_agent.py)
        self._writer.write(struct.pack(">I", len(data)) + data)
        await self._writer.drain()

    async def execute(self, code: str, language: str, timeout: float, session: bool) -> ExecResult:
        """Run one call. After a one-shot call, or any call that ended badly, the worker is dead."""
        t0 = time.monotonic()
        self.calls += 1
        marker = f"\x1e{secrets.token_hex(8)}\x1e" if session else None
        for s in (self.out, self.err):
            s.begin(marker.encode() if marker else None)
            if not s.overflow.is_set():  # a pipe is left unread only past kill_at
                s.read(True)
        req = {"code": code, "language": language, "mode": "session" if session else "oneshot"}
        req.update(timeout=timeout, cpu_s=self.lim.cpu_s, marker=marker)
        deadline = timeout + (_KILL_GRACE_S if session else 0.0)
        cg = self.slot.cgroup
        before = cg.counters() if cg else (0, 0)
        self.violation = None
        if self.calls == 1:  # before any code ran
            self._agent = agent_of(self.proc.pid)
        procs = cg.dirs[0] / "cgroup.procs" if cg and cg.dirs else None
        cpus = min(len(os.sched_getaffinity(0)), self.lim.processes)
        watch = CpuWatch(members(self.proc.pid, procs), self._agent, self.lim.cpu_s, cpus)
        cpu_task = asyncio.create_task(watch.run())
        reply, ended = await self._await_end(req, t0 + deadline, cpu_task)
        cpu_kill = reply is None and cpu_task.done() and not cpu_task.cancelled()
        overflow = self.out.overflow.is_set() or self.err.overflow.is_set()
        wall_kill = not ended and not overflow and not cpu_kill and self.violation is None
        keep = session and reply is not None and not overflow and self.alive
        if keep and not reply.get("marker_lost"):
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(_both(self.out.seen, self.err.seen), _MARKER_GRACE_S)
        rc = self.exited.result() if self.exited.done() else None  # ended by itself
        if cpu_kill:  # past its CPU budget and deaf to SIGXCPU: as if the kernel had ended it
            rc = -signal.SIGXCPU
        for s in (self.out, self.err):
            if keep:
                s.end()
        if not keep:
            await self.kill()
            for s in (self.out, self.err):
                s.read(True)  # to its end: the sandbox is dead, its pipes close
            await self._drain()
        after = cg.counters() if cg else (0, 0)
        hits = {"memory": after[0] > before[0], "processes": after[1] > before[1]}
        return self._result(reply, rc, language, t0, hits, wall_kill=wall_kill, overflow=overflow)

    async def _await_end(
        self, req: dict, deadline: float, cpu: asyncio.Task
    ) -> tuple[dict | None, bool]:
        """Send the call and wait for its reply, the process's exit, an output overflow, or
        `cpu` (the agent past its CPU budget). Returns (reply, ended by itself); (None, False)
        means the deadline passed."""
        reply_task = asyncio.create_task(self._recv())
        others = {
            cpu,
            asyncio.shield(self.exited),
            asyncio.create_task(self.out.overflow.wait()),
            asyncio.create_task(self.err.overflow.wait()),
        }
        pending = {reply_task, *others}
        try:
            await self._send(req)
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    return None, False
                done, pending = await asyncio.wait(
                    pending, timeout=left, return_when="FIRST_COMPLETED"
                )
                if reply_task in done and reply_task.exception() is not None:
                    self.violation = str(reply_task.exception())
                    return None, False
                if reply_task in done and reply_task.result() is not None:
                    return reply_task.result(), True
                if done - {reply_task}:  # exited, overflowed or past its CPU budget
                    if not reply_task.done():  # a reply sent just before exiting is in the socket
                        await asyncio.wait({reply_task}, timeout=0.2)
                    if reply_task.done() and reply_task.exception() is not None:
                        self.violation = str(reply_task.exception())
                        return None, False
                    if reply_task.done() and reply_task.result() is not None:
                        return reply_task.result(), True
                    return None, self.alive is False
                # the control socket closed (bash exec'd, or the code closed it): wait for exit
        except (ConnectionError, OSError):
            return None, False
        finally:
            for t in others | {reply_task}:
                t.cancel()

    def _result(
        self,
        reply: dict | None,
        rc: int | None,
        language: str,
        t0: float,
        hits: dict[str, bool],
        *,
        wall_kill: bool,
        overflow: bool,
    ) -> ExecResult:
        out, out_cut = self.out.text()
        err, err_cut = self.err.text()
        if reply:
            exit_code = reply.get("exit_code")
        elif rc is None:  # we killed it (wall time, output)
            exit_code = None
        elif language == "bash" or rc <= 128:
            exit_code = rc
        else:
            exit_code = -(rc - 128)  # bwrap reports a signal N as 128+N; Python says -N
        reply = reply or {}
        timed_out = wall_kill or bool(reply.get("timed_out"))
        failed = timed_out or overflow or exit_code != 0
        limit = _limit(reply, rc, hits, failed, overflow, timed_out)
        if self.violation is not None:
            limit, exit_code = "control_channel", None
            err += (
                f"\n[sandbox] killed: the code wrote to the sandbox's control channel "
                f"({self.violation})\n"
            )
        if self.evicted is not None:
            limit, exit_code, timed_out = self.evicted, None, False
            err += (
                "\n[sandbox] killed: the session's processes used its CPU budget "
                "(limits.session_cpu_s)\n"
                if self.evicted == "cpu_time"
                else f"\n[sandbox] killed: this sandbox held the most {self.evicted} when all "
                "sandboxes together reached the service's limit\n"
            )
        elif limit == "memory" and not reply.get("error_name"):
            err += "\n[sandbox] killed: memory limit reached\n"
        return ExecResult(
            stdout=out,
            stderr=err,
            exit_code=exit_code,
            timed_out=timed_out,
            limit=limit,
            duration_s=time.monotonic() - t0,
            truncated=out_cut or err_cut,
            result=reply.get("result"),
            error_name=reply.get("error_name"),
            error_value=reply.get("error_value"),
        )

    async def kill(self) -> None:
        """SIGKILL the sandbox (its PID namespace dies with it) and whatever is in its cgroup."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError):
            self.proc.kill()
        if self.slot.cgroup is not None:
            self.slot.cgroup.kill()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(self.exited), 5.0)

    async def _drain(self) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(_both(self.out.eof, self.err.eof), _KILL_GRACE_S)

    async def close(self) -> None:
        """Kill and release everything this worker holds (idempotent)."""
        await self.kill()
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)  # closes the pipes
        if self._writer is not None:
            self._writer.close()
        if self._pidfd is not None:
            asyncio.get_running_loop().remove_reader(self._pidfd)
            os.close(self._pidfd)
            self._pidfd = None
        for pipe in (self.proc.stdout, self.proc.stderr):
            if pipe is not None and not pipe.closed:
                pipe.close()


def _limit(
    reply: dict,
    rc: int | None,
    hits: dict[str, bool],
    failed: bool,
    overflow: bool,
    timed_out: bool,
) -> str | None:
    """Which limit ended a failed call (most specific first)."""
    if not failed:
        return None
    sig = _signal_of(rc) if not reply else None
    if hits["memory"] or reply.get("error_name") == "MemoryError":
        return "memory"
    if hits["processes"]:
        return "processes"
    if reply.get("limit") == "cpu_time":  # a session call interrupted by SIGXCPU
        return "cpu_time"
    if sig in _SIG_LIMIT:
        return _SIG_LIMIT[sig]
    if reply.get("errno") in _DISK_ERRNOS:
        return "file_size"
    if overflow:
        return "output"
    if timed_out:
        return "wall_time"
    return None


class _PipeReader(asyncio.Protocol):
    """Feeds a pipe's chunks to its stream. Not a StreamReader: its own flow control would
    resume a pipe the stream paused."""

    def __init__(self, stream: _Stream, closed: asyncio.Future) -> None:
        self.stream, self.closed = stream, closed

    def data_received(self, data: bytes) -> None:
        self.stream.feed(data)

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.closed.done():
            self.closed.set_result(None)


async def _pump(loop: asyncio.AbstractEventLoop, pipe, stream: _Stream) -> None:
    closed = loop.create_future()
    transport, _ = await loop.connect_read_pipe(lambda: _PipeReader(stream, closed), pipe)
    stream.transport = transport
    if stream.overflow.is_set():
        stream.read(False)
    try:
        await closed
    finally:
        stream.eof.set()
        transport.close()


async def _both(a: asyncio.Event, b: asyncio.Event) -> None:
    await a.wait()
    await b.wait()


def _signal_of(rc: int | None) -> int | None:
    """The signal that ended the code: bwrap reports 128+N, a direct child -N."""
    if rc is None:
        return None
    if rc < 0:
        return -rc
    if rc > 128 and rc - 128 < 65:
        return rc - 128
    return None
