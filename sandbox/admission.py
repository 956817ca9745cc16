"""Admission to the sandbox service's running slots: how many calls run at once, how many may
wait, and when a call is told busy instead (`ExecService` asks before every call).

Three kinds of call, each with `max_running` slots and a queue of `max_queue` of its own, so
none can make another wait or busy: the policy's one-shot calls ("oneshot": a stateless python
tool, bash), session calls ("session": sessions holding all of theirs while their calls honestly
run long once made a grader's call busy), and a grader's one-shot calls ("grader": a reward's,
the client's lane under `base.grading`; a flood of stateless tool calls from many episodes once
held every one-shot slot and filled the queue, and rewards came back busy, as outages). A call
waits at most `max_queue_wait_s`; past the queue, or that wait, it raises `Busy` (HTTP 503 +
Retry-After) instead of the queue growing without bound. A busy call did not run: the client
may retry it.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from agentrl.sandbox.config import ServerConfig

KINDS = ("oneshot", "session", "grader")


class Busy(Exception):
    """Every slot is taken and the queue is full; retry after `retry_after` seconds."""

    def __init__(self, message: str, retry_after: float = 1.0) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class Admission:
    """The running slots of each kind of call and the queue before them. `counters` is the
    service's tally: each busy answer adds one to its "busy"."""

    def __init__(self, cfg: ServerConfig, counters: dict[str, int]) -> None:
        self.cfg, self.counters = cfg, counters
        # each kind has max_running slots and a queue of its own (the module docstring)
        self._sems = {kind: asyncio.Semaphore(cfg.max_running) for kind in KINDS}
        self._waiting = dict.fromkeys(KINDS, 0)
        self._running = dict.fromkeys(KINDS, 0)

    @property
    def waiting(self) -> int:
        return sum(self._waiting.values())

    @property
    def running(self) -> int:
        return sum(self._running.values())

    def lanes(self) -> dict[str, dict[str, int]]:
        """Running and waiting calls of each kind (/health)."""
        return {k: {"running": self._running[k], "waiting": self._waiting[k]} for k in KINDS}

    def refuse_if_full(self, kind: str) -> None:
        """Busy at once when `kind`'s slots are all taken and its queue is full."""
        waiting = self._waiting[kind]
        if self._sems[kind].locked() and waiting >= self.cfg.max_queue:
            self.counters["busy"] += 1
            raise Busy(
                f"sandbox busy: {self.cfg.max_running} {kind} calls running and {waiting} "
                f"waiting (max_queue={self.cfg.max_queue})"
            )

    @contextlib.asynccontextmanager
    async def slot(self, kind: str) -> AsyncIterator[None]:
        """A running slot of `kind` (`KINDS`), held until the block ends; Busy after
        `max_queue_wait_s` in its queue."""
        sem = self._sems[kind]
        self._waiting[kind] += 1
        try:
            if sem.locked():
                await asyncio.wait_for(sem.acquire(), self.cfg.max_queue_wait_s)
                task = asyncio.current_task()
                if task is not None and task.cancelling():  # 3.11's wait_for returned the slot
                    sem.release()  # to a call whose client had gone: nobody's code is not run
                    raise asyncio.CancelledError
            else:  # take the free slot now, before the next request looks at the count
                await sem.acquire()
        except TimeoutError:
            self.counters["busy"] += 1
            raise Busy(
                f"sandbox busy: no slot within max_queue_wait_s={self.cfg.max_queue_wait_s:g}"
            ) from None
        finally:
            self._waiting[kind] -= 1
        self._running[kind] += 1
        try:
            yield
        finally:
            self._running[kind] -= 1
            sem.release()
