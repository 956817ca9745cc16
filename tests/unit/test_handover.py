"""The hand-over between learner and engines (agentrl/handover.py), with fakes that write what
they are asked into one log: the order of a colocated step, the push under `exclusive`, the
restarts. The real servers: tests/e2e/test_train_engines.py -k dead_engine."""

from __future__ import annotations

import contextlib
import io

import pytest
from rich.console import Console

from agentrl.engine import EngineConfig
from agentrl.handover import Handover
from agentrl.types import TrainingError


class Log(list):
    def __call__(self, *what: object) -> None:
        self.append(" ".join(map(str, what)))


class Engine:
    """EngineClient's surface the hand-over uses: `exclusive`, and the control plane's calls
    (`engine.control`, here the same object)."""

    def __init__(self, log: Log, unhealthy: tuple[str, ...] = ()) -> None:
        self.log, self.unhealthy = log, unhealthy
        self.control = self

    async def release_memory_occupation(self) -> None:
        self.log("engine release")

    async def resume_memory_occupation(self, tags: list[str]) -> None:
        self.log("engine resume", *tags)

    @contextlib.asynccontextmanager
    async def exclusive(self, pause: bool = False):
        self.log("exclusive", "cut" if pause else "drain")
        yield 3
        self.log("exclusive end")

    async def update_weight_version(self, version: str, abort_all_requests: bool = True) -> None:
        self.log("version", version)

    async def health(self, deep: bool = False) -> dict[str, bool]:
        self.log("health", "deep" if deep else "")
        return {u: u not in self.unhealthy for u in ("a", "b")}


class Learner:
    def __init__(self, log: Log, name: str) -> None:
        self.log, self.name = log, name

    def onload(self) -> None:
        self.log(self.name, "onload")

    def offload(self) -> None:
        self.log(self.name, "offload")


class Sync:
    def __init__(self, log: Log) -> None:
        self.log = log

    async def push(self, version: str) -> dict[str, float]:
        self.log("push", version)
        return {"sync/bytes": 1.0}

    async def close(self) -> None:
        self.log("sync close")

    async def setup(self) -> None:
        self.log("sync setup")


class Fleet:
    def __init__(self, log: Log, dead: list[str], owned: bool = True) -> None:
        self.log, self.dead, self.owned, self.urls = log, dead, owned, ["a", "b"]

    def down(self, deep: bool = False) -> list[str]:
        return list(self.dead)

    def restart(self, urls: list[str]) -> None:
        self.log("restart", *urls)
        self.dead = []


def handover(log: Log, colocate: bool, fleet: Fleet | None = None, cut: bool = False, **engine):
    cfg = EngineConfig(colocate=colocate)
    learners = [Learner(log, "policy"), Learner(log, "reference")]
    return Handover(Engine(log, **engine), Sync(log), learners, cfg, fleet, cut, "out",  # type: ignore[arg-type]
                    Console(file=io.StringIO()))  # fmt: skip


async def test_a_colocated_step_hands_the_gpu_over_in_order():
    log = Log()
    h = handover(log, colocate=True)
    await h.to_learner()
    out = await h.push("4")
    assert log == [
        "engine release", "policy onload", "reference onload",  # to the learner
        "engine resume weights", "exclusive drain", "push 4", "exclusive end",  # the push
        "policy offload", "reference offload", "engine resume kv_cache cuda_graph",  # back
    ]  # fmt: skip
    assert out["sync/cut_turns"] == 0 and out["sync/bytes"] == 1 and out["sync/drain_s"] >= 0


async def test_not_colocated_only_the_push_runs_and_async_cuts_the_turns_in_flight():
    log = Log()
    h = handover(log, colocate=False, cut=True)
    await h.to_learner()
    out = await h.push("2")
    await h.relabel("3")
    assert log == ["exclusive cut", "push 2", "exclusive end", "version 3"]
    assert out["sync/cut_turns"] == 3


async def test_a_dead_server_after_the_rollout_is_restarted_and_given_the_current_weights():
    log = Log()
    h = handover(log, colocate=True, fleet=Fleet(log, dead=["b"]))
    assert await h.recover(step=5, suspect=False) == 1
    assert log == [
        "restart b", "sync close", "sync setup",
        "engine release", "policy onload", "reference onload",
        "engine resume weights", "exclusive drain", "push 4", "exclusive end",
        "policy offload", "reference offload", "engine resume kv_cache cuda_graph",
    ]  # fmt: skip
    log.clear()
    assert await h.recover(step=6, suspect=False) == 0 and log == []


async def test_lost_episodes_with_every_server_up_make_each_generate_and_foreign_ones_stop():
    log = Log()
    h = handover(log, colocate=False, unhealthy=("a",))  # servers given by engine.urls
    assert await h.recover(step=1, suspect=False) == 0 and log == []  # not ours: no /health
    with pytest.raises(TrainingError, match=r"\['a'\] stopped answering during step 2"):
        await h.recover(step=2, suspect=True)
    assert log == ["health deep"]


async def test_a_server_that_died_during_the_update_is_restarted_before_the_push():
    log = Log()
    h = handover(log, colocate=False, fleet=Fleet(log, dead=["a"]))
    assert await h.revive_before_push(step=3) == 1
    assert log == ["restart a", "sync close", "sync setup"]
    assert await h.revive_before_push(step=3) == 0
