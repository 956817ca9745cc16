"""An agent worker (agentrl/agent_workers.py: `_serve`) that reads an episode's cancel before its
run (the caller gave up while the run was still being sent from a thread) does not run it:
before, the cancel found nothing to stop and the episode then ran for nobody."""

from __future__ import annotations

import asyncio
import multiprocessing
import threading

from agentrl.agent_workers import _serve


def test_a_cancel_that_comes_before_its_run_stops_it():
    ours, theirs = multiprocessing.Pipe()
    worker = threading.Thread(target=lambda: asyncio.run(_serve(theirs)), daemon=True)
    worker.start()
    ours.send(("cancel", 1))
    ours.send(("run", 1, b"not a pickled job"))
    ours.send(("run", 2, b"not a pickled job"))
    assert ours.poll(30), "the worker answered nothing"
    done = ours.recv()
    ours.send(("stop",))
    worker.join(30)
    assert done[:3] == ("done", 2, False), done  # job 1 never ran; job 2 failed to unpickle
    assert not ours.poll(1)
