"""The e2b backend, and unchanged e2b SDK code, against our own service speaking the e2b protocol
on loopback: no internet, no e2b account."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from agentrl.sandbox import E2BConfig, SandboxConfig, SandboxUnavailable, ServerConfig, make_sandbox
from agentrl.sandbox.server import LocalService

pytest.importorskip("e2b_code_interpreter")

from e2b_code_interpreter import AsyncSandbox  # noqa: E402

from agentrl.sandbox.e2b_backend import E2BSandbox  # noqa: E402


@pytest.fixture(scope="module")
def service() -> Iterator[LocalService]:
    with LocalService(ServerConfig(warm_workers=2, token="local-key")) as svc:
        yield svc


@pytest.fixture
def e2b_env(service: LocalService, monkeypatch: pytest.MonkeyPatch) -> str:
    base = f"{service.url}/e2b"
    monkeypatch.setenv("E2B_API_URL", base)
    monkeypatch.setenv("E2B_SANDBOX_URL", base)
    monkeypatch.setenv("E2B_API_KEY", "local-key")
    return base


async def test_unchanged_e2b_sdk_code_runs_on_our_service(e2b_env: str) -> None:
    sbx = await AsyncSandbox.create()
    try:
        first = await sbx.run_code("x = 41\nprint('hello')")
        assert first.logs.stdout == ["hello\n"] and first.error is None
        second = await sbx.run_code("x + 1")
        assert second.text == "42"
        err = await sbx.run_code("def f():\n    return 1 / 0\nf()")
        assert err.error is not None and err.error.name == "ZeroDivisionError"
        assert "return 1 / 0" in err.error.traceback
        ctx = await sbx.create_code_context()
        assert (await sbx.run_code("y = 5", context=ctx)).error is None
        isolated = await sbx.run_code("x", context=ctx)  # a context has its own namespace
        assert isolated.error is not None and isolated.error.name == "NameError"
        assert (await sbx.run_code("y * 2", context=ctx)).text == "10"
        assert {c.id for c in await sbx.list_code_contexts()} >= {ctx.id}
        await sbx.remove_code_context(ctx)
        assert await sbx.is_running()
    finally:
        await sbx.kill()
    assert not await sbx.is_running()


async def test_wrong_api_key_is_refused(e2b_env: str) -> None:
    from e2b.exceptions import AuthenticationException

    with pytest.raises(AuthenticationException):
        await AsyncSandbox.create(api_key="wrong")


async def test_e2b_backend_sessions_and_stateless_runs(e2b_env: str) -> None:
    sb = make_sandbox(SandboxConfig(backend="e2b", e2b=E2BConfig(sandbox_timeout_s=60)))
    assert isinstance(sb, E2BSandbox)
    try:
        await sb.run("total = 40", session="traj-1")
        res = await sb.run("total += 2\nprint(total)\ntotal", session="traj-1")
        assert res.stdout == "42\n" and res.result == "42" and res.ok
        res = await sb.run("print(total)")  # stateless: a fresh context
        assert res.error_name == "NameError" and res.exit_code == 1
        assert "NameError" in res.stderr
        res = await sb.run("import time\ntime.sleep(10)", timeout=1.0, session="traj-2")
        assert res.timed_out and res.limit == "wall_time"
        await sb.close_session("traj-1")
        res = await sb.run("total", session="traj-1")  # a new sandbox for the key
        assert res.error_name == "NameError"
    finally:
        await sb.aclose()


async def test_e2b_backend_unreachable_raises_sandbox_unavailable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("E2B_API_URL", "http://127.0.0.1:9")
    monkeypatch.setenv("E2B_SANDBOX_URL", "http://127.0.0.1:9")
    monkeypatch.setenv("E2B_API_KEY", "x")
    monkeypatch.setenv("E2B_CONNECTION_RETRIES", "0")
    sb = E2BSandbox(retries=0)
    with pytest.raises(SandboxUnavailable, match="e2b"):
        await sb.run("1", session="s")
    await sb.aclose()
