"""The per-call CPU budget (`Limits.cpu_s`, per process), enforced from outside the sandbox.

The agent sets a soft RLIMIT_CPU for each call, but the code runs in the agent's process: it may
raise that soft limit up to the hard one (for a session the hard limit is the whole session's,
`session_cpu_s`) and ignore SIGXCPU. So while a call runs the worker also reads the CPU time of
every process of the sandbox from /proc (the sandbox's cgroup lists them; without one, the
process tree under the worker). A process past `cpu_s` CPU seconds in this call gets SIGXCPU,
which is what the soft limit would send (it interrupts a session call; it ends any other
process), and SIGKILL once past `cpu_s + GRACE_CPU_S`. When that process is the agent's own
(the one running the call), `CpuWatch.run` returns instead and the worker ends the call with
limit "cpu_time". Nothing is read between a session's calls (`session_cpu_s` bounds those).

Polls are spaced by the least time in which any process could reach its budget (what is left
over the CPUs it may use), at least `_MIN_POLL_S`: a spinning call costs a few reads of /proc.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from collections.abc import Callable
from pathlib import Path

GRACE_CPU_S = 0.5  # past the budget: SIGXCPU at once, SIGKILL (or the call's end) this much later
_MIN_POLL_S = 0.05
_MAX_POLL_S = 2.0
_TICK = os.sysconf("SC_CLK_TCK")

Proc = tuple[int, int]  # (pid, start time in clock ticks): a pid the kernel reused is another


def cpu_of(pid: int) -> tuple[Proc, float] | None:
    """(the process, CPU seconds of all its threads so far), or None once it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
        rest = data[data.rindex(b")") + 2 :].split()  # fields 3.. (the name may hold spaces)
        return (pid, int(rest[19])), (int(rest[11]) + int(rest[12])) / _TICK
    except (OSError, ValueError, IndexError):
        return None


def _children(pid: int) -> list[int]:
    out: list[int] = []
    with contextlib.suppress(OSError):
        for tid in os.listdir(f"/proc/{pid}/task"):  # a thread's children are listed under it
            with (
                contextlib.suppress(OSError, ValueError),
                open(f"/proc/{pid}/task/{tid}/children") as f,
            ):
                out += [int(c) for c in f.read().split()]
    return out


def tree(pid: int) -> list[int]:
    """`pid` and every process below it."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo += _children(p)
    return out


def members(root_pid: int, procs_file: Path | None) -> Callable[[], list[int]]:
    """What lists a sandbox's processes: its cgroup's (which daemons that left the tree stay
    in), else the tree under its outermost process."""
    if procs_file is None:
        return lambda: tree(root_pid)

    def listed() -> list[int]:
        try:
            return [int(p) for p in procs_file.read_text().split()]
        except (OSError, ValueError):
            return tree(root_pid)

    return listed


def agent_of(root_pid: int) -> Proc | None:
    """The agent's process, before any code ran: the end of the chain from the worker's own
    process (bwrap -> bwrap as the namespace's init -> agent; without bwrap, itself)."""
    pid = root_pid
    while len(kids := _children(pid)) == 1:
        pid = kids[0]
    got = cpu_of(pid)
    return got[0] if got else None


class CpuWatch:
    """One call's watch. Made before the call starts (the CPU used so far is not this call's)."""

    def __init__(
        self, pids: Callable[[], list[int]], agent: Proc | None, budget_s: float, cpus: int
    ) -> None:
        self.pids, self.agent, self.budget = pids, agent, budget_s
        self.cpus = max(1, cpus)
        self.base: dict[Proc, float] = {}
        self.warned: set[Proc] = set()
        for pid in pids():
            if got := cpu_of(pid):
                self.base[got[0]] = got[1]

    def check(self) -> float | None:
        """Signal the processes past the budget; None when the agent's is past its grace,
        else the most CPU any process used in this call."""
        worst = 0.0
        for pid in self.pids():
            got = cpu_of(pid)
            if got is None:
                continue
            proc, cpu = got
            used = cpu - self.base.get(proc, 0.0)
            # SIGXCPU first, always: also for a process that passed the budget and its grace
            # between two checks (a long poll on a busy machine)
            if used >= self.budget and proc not in self.warned:
                self.warned.add(proc)
                _signal(pid, signal.SIGXCPU)
            if used >= self.budget + GRACE_CPU_S:
                if proc == self.agent:
                    return None
                _signal(pid, signal.SIGKILL)
            worst = max(worst, used)
        return worst

    async def run(self) -> None:
        """Returns when the agent's process is past `budget + GRACE_CPU_S` (else cancelled)."""
        while (worst := self.check()) is not None:
            left = (self.budget if worst < self.budget else self.budget + GRACE_CPU_S) - worst
            await asyncio.sleep(min(max(left / self.cpus, _MIN_POLL_S), _MAX_POLL_S))


def _signal(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, sig)
