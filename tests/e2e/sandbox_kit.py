"""What the sandbox attack suites share (test_sandbox_attacks.py, test_sandbox_reward_hacks.py):
the service they attack, with a secret in its environment, and the checks after an attack."""

from __future__ import annotations

import asyncio
import os
import secrets
import time
from collections.abc import Iterator

import pytest

from agentrl.sandbox import ExecResult, Limits, ServerConfig, ServiceSandbox
from agentrl.sandbox.server import LocalService

SECRET = "agentrl-secret-" + secrets.token_hex(8)
LIMITS = Limits(
    wall_s=2, max_wall_s=60, cpu_s=1, memory_mb=256, processes=32, file_size_mb=8, tmp_mb=32,
    output_bytes=64 * 1024, output_kill_bytes=1 << 20,
)  # fmt: skip


def attacked_service() -> Iterator[LocalService]:
    """The local service under attack (a module fixture's body: `yield from` it)."""
    old = os.environ.get("AGENTRL_TEST_SECRET")
    os.environ["AGENTRL_TEST_SECRET"] = SECRET  # the service has it; sandboxed code must not
    try:
        mode = os.environ.get("AGENTRL_TEST_SANDBOX_ISOLATION", "auto")  # e.g. rlimits
        cfg = ServerConfig(warm_workers=4, max_running=4, limits=LIMITS, isolation=mode)
        with LocalService(cfg) as svc:
            yield svc
    finally:
        if old is None:
            os.environ.pop("AGENTRL_TEST_SECRET", None)
        else:
            os.environ["AGENTRL_TEST_SECRET"] = old


def needs(isolation: dict, what: str) -> None:
    """Skip the parts whose flag (or safety) depends on a cgroup controller or a private tmpfs."""
    have = {
        "pids": "pids" in (isolation["cgroup"] or ""),
        "memory": "memory" in (isolation["cgroup"] or ""),
        "cpu": "cpu" in (isolation["cgroup"] or ""),
        "tmpfs": isolation["private_tmp"] == "tmpfs",
    }
    if not have[what]:
        pytest.skip(f"this host gives the sandbox no {what} limit of its own")


async def serves_next_100(url: str) -> None:
    """100 more requests succeed: 4 one-shot calls and 96 calls in 4 sessions, in parallel."""
    sb = ServiceSandbox(url, retries=0)

    async def session(k: int) -> None:
        key = f"after-{k}-{secrets.token_hex(4)}"
        await sb.run("n = 0", session=key)
        for i in range(1, 24):
            res = await sb.run("n += 1; n", session=key)
            assert res.result == str(i), res
        await sb.close_session(key)

    async def oneshot(k: int) -> None:
        res = await sb.run(f"print({k} * 2)")
        assert res.stdout == f"{2 * k}\n" and res.ok, res

    await asyncio.gather(*(session(k) for k in range(4)), *(oneshot(k) for k in range(4)))
    await sb.aclose()


async def attack(url: str, code: str, timeout: float = 2.0, **kw) -> tuple[ExecResult, float]:
    sb = ServiceSandbox(url, retries=0)
    t0 = time.monotonic()
    res = await sb.run(code, timeout=timeout, **kw)
    elapsed = time.monotonic() - t0
    await sb.aclose()
    assert elapsed < timeout + 5.0, f"took {elapsed:.1f}s"  # generous: CI hosts are shared
    return res, elapsed
