"""Admission to the sandbox service's running slots: how many calls run at once, how many may
wait, and when a call is told busy instead (`ExecService` asks before every call).

At most `max_running` one-shot calls and as many session calls run at once, apart (sessions
holding all of theirs never make a grader's one-shot call wait); up to `max_queue` more wait, each
at most `max_queue_wait_s`; beyond that a call raises `Busy` at once (HTTP 503 + Retry-After)
instead of the queue growing without bound. A busy call did not run: the client may retry it.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from agentrl.sandbox.config import ServerConfig

KINDS = ("oneshot", "session")


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
        # one-shot calls (a grader's) and session calls each have max_running slots of their own
        self._sems = {kind: asyncio.Semaphore(cfg.max_running) for kind in KINDS}
        self.waiting = 0
        self.running = 0

    def refuse_if_full(self, kind: str) -> None:
        """Busy at once when `kind`'s slots are all taken and the queue is full."""
        if self._sems[kind].locked() and self.waiting >= self.cfg.max_queue:
            self.counters["busy"] += 1
            raise Busy(
                f"sandbox busy: {self.cfg.max_running} running and {self.waiting} waiting "
                f"(max_queue={self.cfg.max_queue})"
            )

    @contextlib.asynccontextmanager
    async def slot(self, kind: str) -> AsyncIterator[None]:
        """A running slot of `kind` ("oneshot" or "session"), held until the block ends; Busy
        after `max_queue_wait_s` in the queue."""
        sem = self._sems[kind]
        self.waiting += 1
        try:
            if sem.locked():
                await asyncio.wait_for(sem.acquire(), self.cfg.max_queue_wait_s)
            else:  # take the free slot now, before the next request looks at the count
                await sem.acquire()
        except TimeoutError:
            self.counters["busy"] += 1
            raise Busy(
                f"sandbox busy: no slot within max_queue_wait_s={self.cfg.max_queue_wait_s:g}"
            ) from None
        finally:
            self.waiting -= 1
        self.running += 1
        try:
            yield
        finally:
            self.running -= 1
            sem.release()
