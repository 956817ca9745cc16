"""The restart of a sandbox service this run started is every caller's: a caller that gives up
during it (its episode's group dropped, its tool's deadline) neither abandons it half done nor
makes the next caller start a second service (agentrl/sandbox/client.py: `revive`)."""

from __future__ import annotations

import asyncio
import socket
import threading

import pytest
from aiohttp import web

from agentrl.sandbox.base import ExecResult
from agentrl.sandbox.client import ServiceSandbox


class SlowRestart:
    """A service that died; its restart (in a thread, as LocalService's) waits for `go`, as a
    start on a busy host takes seconds, and then answers at `url`."""

    def __init__(self, url: str) -> None:
        self.url, self.restarts = url, 0
        self.entered, self.go = threading.Event(), threading.Event()

    def alive(self) -> bool:
        return self.restarts > 0

    def restart(self) -> str:
        self.entered.set()
        assert self.go.wait(30), "the test never let the restart finish"
        self.restarts += 1
        return self.url


def _dead_url() -> str:
    """A loopback port nothing listens on: the dead service's."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"


async def _new_service() -> tuple[web.AppRunner, str]:
    """The restarted service: answers every call with `ran`."""

    async def run(request: web.Request) -> web.Response:
        return web.Response(text=ExecResult(stdout="ran\n").model_dump_json())

    app = web.Application()
    app.router.add_post("/v1/run", run)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    return runner, f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"  # type: ignore[union-attr]


async def test_a_caller_that_gives_up_during_the_restart_leaves_it_to_the_others() -> None:
    runner, url = await _new_service()
    owner = SlowRestart(url)
    sb = ServiceSandbox(_dead_url(), owner=owner, retries=2, backoff_s=0.01, max_restarts=3)
    try:
        first = asyncio.ensure_future(sb.run("1"))
        assert await asyncio.to_thread(owner.entered.wait, 30)  # its call found the service dead
        second = asyncio.ensure_future(sb.run("2"))  # another episode's call, during the restart
        await asyncio.sleep(0.05)
        first.cancel()  # the first caller's episode is dropped while the service starts
        with pytest.raises(asyncio.CancelledError):
            await first
        owner.go.set()
        res = await second  # before: it began a second restart (a second service) of its own
        assert res.stdout == "ran\n", res
        third = await sb.run("3", session="s")  # before: sent to the dead port, unavailable
        assert third.stdout == "ran\n", third
        assert (owner.restarts, sb.restarts, sb.url) == (1, 1, url)
    finally:
        owner.go.set()
        await sb.aclose()
        await runner.cleanup()
