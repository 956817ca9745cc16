"""What a session's own code does to the service outside its calls, and to its own limits:
an output flood between calls, and a CPU budget the code tries to lift (issue 36, item 8)."""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Iterator

import psutil
import pytest

from sandbox import Limits, ServerConfig, ServiceSandbox
from sandbox.server import LocalService

LIMITS = Limits(wall_s=5, cpu_s=1, output_bytes=64 * 1024, output_kill_bytes=1 << 20)


@pytest.fixture(scope="module")
def service() -> Iterator[LocalService]:
    with LocalService(ServerConfig(warm_workers=2, max_running=4, limits=LIMITS)) as svc:
        yield svc


def _service_cpu_s(svc: LocalService) -> float:
    assert svc.proc is not None
    t = psutil.Process(svc.proc.pid).cpu_times()  # the service alone, not its sandboxes
    return t.user + t.system


FLOOD = (
    "import sys, threading, time\nchunk = 'x' * 65536\n"
    "def spam():\n    time.sleep(0.1)\n    while True:\n        sys.stdout.write(chunk)\n"
    "threading.Thread(target=spam, daemon=True).start()"
)


async def test_a_flood_between_calls_costs_the_service_nothing(service: LocalService) -> None:
    """A thread printing forever after its call returned once kept the service's pipe readers
    busy until the next call (5.1 CPU-s per 13 s); now they stop at output_kill_bytes and the
    flooder blocks on its full pipe. The next call says the session was reset (output)."""
    sb = ServiceSandbox(service.url, retries=0)
    key, innocent = "flood-" + secrets.token_hex(3), "calm-" + secrets.token_hex(3)
    assert (await sb.run("n = 1", session=innocent)).ok
    assert (await sb.run(FLOOD, session=key)).ok
    await asyncio.sleep(0.5)  # the flood is running, far past output_kill_bytes (1 MB)
    before = _service_cpu_s(service)
    await asyncio.sleep(2.0)
    idle = _service_cpu_s(service) - before
    print(f"service CPU over 2 s of flood: {idle:.3f} s")
    assert idle < 0.3, f"the service spent {idle:.2f} CPU-s on a flood between calls"
    res = await sb.run("1 + 1", session=key)
    assert res.limit == "output" and res.session_reset, res
    assert (await sb.run("2 + 2", session=key)).result == "4"  # a new interpreter serves
    assert (await sb.run("n + 1", session=innocent)).result == "2"
    await sb.close_session(key)
    await sb.close_session(innocent)
    await sb.aclose()


async def test_output_between_calls_below_the_limit_lands_in_the_next_call(
    service: LocalService,
) -> None:
    sb = ServiceSandbox(service.url, retries=0)
    key = "ticks-" + secrets.token_hex(3)
    code = (
        "import threading, time\ndef tick():\n    time.sleep(0.2)\n"
        "    for i in range(3):\n        print('tick', i, flush=True)\n"
        "threading.Thread(target=tick).start()"
    )
    assert (await sb.run(code, session=key)).ok
    await asyncio.sleep(0.6)
    res = await sb.run("print('now')", session=key)
    assert res.stdout == "tick 0\ntick 1\ntick 2\nnow\n" and res.ok, res
    await sb.close_session(key)
    await sb.aclose()
