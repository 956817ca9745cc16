"""An agent worker's start is every episode's: an episode that gives up while the worker starts
(its timeout, its group dropped) leaves the process to the next episode instead of leaking it
(alive and unrecorded until the trainer ended) and making the next start another
(agentrl/agent_workers.py: `AgentWorkers._pick`)."""

from __future__ import annotations

import asyncio
import threading

import pytest

from agentrl.agent_workers import AgentWorkers


class HeldStart(AgentWorkers):
    """Starts real worker processes, each once `go` is set, as a start on a busy host waits."""

    def __init__(self, n: int) -> None:
        super().__init__(n)
        self.entered, self.go, self.started = threading.Event(), threading.Event(), []
        self.first_done = threading.Event()

    def _spawn(self, i, loop):
        self.entered.set()
        assert self.go.wait(30), "the test never let the start go on"
        w = super()._spawn(i, loop)
        self.started.append(w)
        self.first_done.set()
        return w


async def test_an_episode_that_gives_up_during_a_workers_start_leaves_it_to_the_next() -> None:
    workers = HeldStart(1)
    try:
        first = asyncio.ensure_future(workers._pick())  # the first episode starts worker 0
        assert await asyncio.to_thread(workers.entered.wait, 30)
        first.cancel()  # its episode's group is dropped during the start
        with pytest.raises(asyncio.CancelledError):
            await first
        workers.go.set()
        assert await asyncio.to_thread(workers.first_done.wait, 30)  # the process is up
        w = await workers._pick()  # the next episode
        assert len(workers.started) == 1, "a second worker was started: the first one leaked"
        assert w is workers.started[0] and w.proc.is_alive()
    finally:
        workers.go.set()
        await workers.aclose()
        for w in workers.started:  # what aclose did not know of (the leak)
            if w.proc.is_alive():
                w.proc.kill()
    assert not any(w.proc.is_alive() for w in workers.started)
