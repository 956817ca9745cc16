"""How an answer reaches the agent, and what an answer it never got does to its episode: the
answer is written from inside the request's handler (`deliver`), and recorded samples the agent
did not get end the episode as the system's failure (`unseen`: a request's `n` samples are also
gathered all or none, `agentrl.tool.gather_all`, and a failure after some were recorded is one)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from aiohttp import web

from agentrl.gateway.capture import EpisodeCapture
from agentrl.types import StopReason


def unseen(ep: EpisodeCapture, what: str) -> None:
    """Recorded answers the agent never got end the episode as the system's failure
    (`aborted`, not trained): its later requests go on from what it did see, so those turns
    would be trained with a reward they had no part in (an SDK's retry after its own timeout
    is the common case)."""
    ep.flag(StopReason.ABORTED, f"the agent never got a recorded answer: {what} when the "
                                "request failed or the agent went away")  # fmt: skip


async def deliver(
    request: web.Request, ep: EpisodeCapture, bodies: list[Any], stream: bool = False
) -> web.StreamResponse:
    """Send the answer from inside the handler, so that an agent gone before it is written
    (the handler cancelled, the connection reset) is known: `unseen`. Returned as a plain
    response, aiohttp wrote it after the handler and a failure there went unnoticed."""
    if stream:
        resp = web.StreamResponse(
            headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
        )
        data = [b"data: " + json.dumps(b).encode() + b"\n\n" for b in bodies]
        data.append(b"data: [DONE]\n\n")
    else:
        resp = web.json_response(bodies[0])
        data = []
    try:
        await resp.prepare(request)
        for d in data:
            await resp.write(d)
        await resp.write_eof()
    except (ConnectionError, asyncio.CancelledError):
        if not ep.closed:
            unseen(ep, "its answer was being written")
        raise
    return resp
