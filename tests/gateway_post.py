"""One request to a Gateway from outside, as an agent sends it: the gateway started, an episode
opened, the body posted under the episode's key, the gateway closed (tests/unit and tests/e2e)."""

from __future__ import annotations

from typing import Any

import httpx


async def post_once(gw: Any, body: dict[str, Any]) -> tuple[Any, httpx.Response]:
    """(the episode, the gateway's answer) for `body` sent to /v1/chat/completions."""
    url = await gw.start()
    ep = gw.open("t", 0, "s")
    try:
        async with httpx.AsyncClient() as http:
            r = await http.post(f"{url}/chat/completions", json=body,
                                headers={"Authorization": f"Bearer {ep.key}"})  # fmt: skip
    finally:
        await gw.aclose()
    return ep, r
