"""A sandbox call's wait that is not the code's (the service busy, its retries, a restart) ends
as SandboxUnavailable within the call's budget, before the tool's own deadline could charge the
model a timeout (agentrl/sandbox/client.py: `run`). Before, the client retried a busy service
past the python tool's deadline and the model read "timed out after 10s" for the service's
load, as its own error."""

from __future__ import annotations

import pytest
from aiohttp import web

from agentrl.sandbox.base import SandboxUnavailable
from agentrl.sandbox.client import ServiceSandbox
from agentrl.tool import ToolContext
from agentrl.tools.python import PythonTool


class QuickPython(PythonTool):
    """The python tool with its deadline's grace scaled down with the client's margin below
    (as PythonTool's CALL_MARGIN_S + 15 s over the client's CALL_MARGIN_S)."""

    timeout_grace_s = 5.0


async def _busy_service() -> tuple[web.AppRunner, str, list[int]]:
    """A service that answers every call 503 busy, come back in 2 s; counts the calls."""
    seen: list[int] = []

    async def run(request: web.Request) -> web.Response:
        seen.append(1)
        return web.Response(status=503, text="sandbox busy", headers={"Retry-After": "2"})

    app = web.Application()
    app.router.add_post("/v1/run", run)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    return runner, f"http://127.0.0.1:{port}", seen


async def test_a_busy_service_is_sandbox_unavailable_not_the_models_timeout() -> None:
    runner, url, seen = await _busy_service()
    sb = ServiceSandbox(url, retries=20, backoff_s=0.01, call_margin_s=0.5)
    ctx = ToolContext(session="s", sandbox=sb, timeout_s=0.5)
    try:
        with pytest.raises(SandboxUnavailable, match=r"did not answer within 1s.*overloaded"):
            await QuickPython().invoke({"code": "print(1)"}, ctx)
        assert seen, "the call never reached the service"
    finally:
        await sb.aclose()
        await runner.cleanup()
