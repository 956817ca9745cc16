"""A sandbox call whose client goes away (its request task cancelled) in the loop iteration in
which its queued slot frees: Python 3.11's `asyncio.wait_for` returned the slot and dropped the
cancel, so the service ran code nobody waited for (sandbox/admission.py: `Admission.slot`)."""

from __future__ import annotations

import asyncio

import pytest

from agentrl.sandbox.admission import Admission
from agentrl.sandbox.config import ServerConfig


def test_a_call_cancelled_as_its_slot_frees_does_not_run():
    adm = Admission(ServerConfig(max_running=1, max_queue=4, max_queue_wait_s=30), {"busy": 0})
    ran: list[str] = []

    async def call(name: str, hold: asyncio.Event | None = None) -> None:
        async with adm.slot("oneshot"):
            ran.append(name)
            if hold is not None:
                await hold.wait()

    async def main() -> None:
        loop = asyncio.get_running_loop()
        hold = asyncio.Event()
        first = asyncio.create_task(call("first", hold))
        await asyncio.sleep(0)
        queued = asyncio.create_task(call("queued"))
        await asyncio.sleep(0.05)  # waiting for the slot
        hold.set()  # the first call ends and frees the slot; the cancel lands one step later,
        loop.call_soon(loop.call_soon, loop.call_soon, queued.cancel)  # as its acquire ends
        await first
        with pytest.raises(asyncio.CancelledError):
            await queued
        assert adm.lanes()["oneshot"] == {"running": 0, "waiting": 0}

    asyncio.run(main())
    assert ran == ["first"], ran
