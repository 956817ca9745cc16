"""Sibling awaits go through `agentrl.tool.gather_all`: when one fails, the others are cancelled
and awaited before the error goes on, so nothing runs on for nobody. A plain `asyncio.gather`
raised at the first failure and left the rest running: a /flush_cache to a server that did not
answer, rank 0 blocked joining a weight-update group the servers had refused, another rank's
broadcast, another task's evaluation episodes. Real aiohttp servers on 127.0.0.1, real tasks."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import pytest
from aiohttp import web

from agentrl.engine import EngineClient, EngineUnavailable
from agentrl.evaluate import evaluate
from agentrl.learner.sync.base import WeightSyncConfig, WeightSyncError
from agentrl.learner.sync.distributed import DistributedSync
from agentrl.types import Task, Trajectory

Handler = Callable[[int, web.Request], Awaitable[web.StreamResponse]]


@asynccontextmanager
async def servers(n: int, handler: Handler) -> AsyncIterator[list[str]]:
    """`n` HTTP servers on 127.0.0.1 (ephemeral ports) answering through `handler(i, request)`."""
    runners = []
    try:
        for i in range(n):

            async def route(request: web.Request, i: int = i) -> web.StreamResponse:
                return await handler(i, request)

            app = web.Application()
            app.router.add_route("*", "/{path:.*}", route)
            runner = web.AppRunner(app, access_log=None)
            await runner.setup()
            await web.TCPSite(runner, "127.0.0.1", 0).start()
            runners.append(runner)
        yield [f"http://127.0.0.1:{r.addresses[0][1]}" for r in runners]
    finally:
        for r in runners:
            await r.cleanup()


def running(qualname: str) -> list[asyncio.Task]:
    """This loop's unfinished tasks whose coroutine is `qualname`."""
    return [
        t for t in asyncio.all_tasks() if not t.done() and t.get_coro().__qualname__ == qualname
    ]


async def test_flush_cache_with_one_server_gone_leaves_no_request_running():
    """Server 0 holds /flush_cache open; server 1 drops the connection once server 0 has the
    request. The call fails with server 1's EngineUnavailable, and server 0's request is over."""
    holding, release = asyncio.Event(), asyncio.Event()

    async def handler(i: int, request: web.Request) -> web.StreamResponse:
        if i == 0:
            holding.set()
            await release.wait()  # no answer while the call lasts
            return web.Response()
        await holding.wait()
        assert request.transport is not None
        request.transport.close()
        return web.Response()

    async with servers(2, handler) as urls, EngineClient(urls, timeout_s=600) as engine:
        with pytest.raises(EngineUnavailable, match=rf"{urls[1]}/flush_cache"):
            await engine.control.flush_cache()
        assert running("Http.call") == []  # before: server 0's call, still waiting
        release.set()  # the server's handler ends (its client is gone), so it stops at once


class Rank0:
    """The learner as DistributedSync sees it: rank 0 binds at once; its join (which blocks
    until every server has joined) answers when `joined` is set; each rank's broadcast is a
    future the test settles."""

    world_size = 2

    def __init__(self, joined: bool) -> None:
        self.joined = joined
        self.joins: list[asyncio.Future] = []
        self.broadcasts: list[asyncio.Future] = []

    def model_dtype(self) -> str:
        return "float32"

    def buckets(self, bucket_mb: float, dtype: str | None = None) -> list[Any]:
        return []

    def on_rank0(self, cls: type, fn: Callable, *args: Any) -> tuple[str, int]:
        return "127.0.0.1", 29500

    def on_rank0_async(self, cls: type, fn: Callable, *args: Any) -> asyncio.Future:
        fut = asyncio.get_running_loop().create_future()
        if self.joined:
            fut.set_result(None)
        self.joins.append(fut)
        return fut

    def on_ranks_async(self, cls: type, fn: Callable, *args: Any) -> list[asyncio.Future]:
        loop = asyncio.get_running_loop()
        self.broadcasts = [loop.create_future() for _ in range(self.world_size)]
        return self.broadcasts


def sync_config() -> WeightSyncConfig:
    return WeightSyncConfig(method="distributed", backend="gloo", master_address="127.0.0.1")


async def test_a_group_the_servers_refuse_stops_waiting_for_rank_0():
    async def refuse(i: int, request: web.Request) -> web.StreamResponse:
        return web.json_response({"success": False, "message": "no gloo here"}, status=400)

    learner = Rank0(joined=False)
    async with servers(1, refuse) as urls, EngineClient(urls) as engine:
        sync = DistributedSync(sync_config(), learner, engine)
        with pytest.raises(WeightSyncError, match="no gloo here"):
            await sync.setup()
    assert learner.joins[0].cancelled()  # before: still waiting on rank 0's join


async def test_one_rank_failing_its_broadcast_stops_waiting_for_the_others():
    async def ok(i: int, request: web.Request) -> web.StreamResponse:
        return web.json_response({"success": True})

    learner = Rank0(joined=True)
    async with servers(1, ok) as urls, EngineClient(urls) as engine:
        sync = DistributedSync(sync_config(), learner, engine)
        await sync.setup()
        push = asyncio.create_task(sync.push("1"))
        while not learner.broadcasts:
            await asyncio.sleep(0)
        learner.broadcasts[1].set_exception(RuntimeError("rank 1: gloo timeout"))
        with pytest.raises(RuntimeError, match="rank 1"):
            await push
    assert learner.broadcasts[0].cancelled()  # before: rank 0's wait ran on


class OneFails:
    """Task "slow"'s group waits for ever (and notes when it ends); task "bad"'s raises."""

    def __init__(self) -> None:
        self.ended: list[str] = []

    async def run_group(self, task: Task, n: int | None = None) -> list[Trajectory]:
        if task.id == "bad":
            raise RuntimeError("a bug in the env")
        try:
            await asyncio.Event().wait()
        finally:
            self.ended.append(task.id)
        return []


async def test_an_evaluation_whose_group_raises_stops_the_other_groups():
    rollout = OneFails()
    tasks = [Task(id="slow", data={}), Task(id="bad", data={})]
    with pytest.raises(RuntimeError, match="a bug in the env"):
        await evaluate(rollout, tasks, samples=2)  # type: ignore[arg-type]
    assert rollout.ended == ["slow"]  # before: still rolling out
