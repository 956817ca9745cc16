"""One request to a Gateway from outside, as an agent sends it: the gateway started, an episode
opened, the body posted under the episode's key, the gateway closed (tests/unit and tests/e2e)."""

from __future__ import annotations

from typing import Any

import httpx


async def post_once(
    gw: Any, body: dict[str, Any], route: str = "chat/completions"
) -> tuple[Any, httpx.Response]:
    """(the episode, the gateway's answer) for `body` sent to /v1/<route>."""
    url = await gw.start()
    ep = gw.open("t", 0, "s")
    try:
        async with httpx.AsyncClient() as http:
            r = await http.post(f"{url}/{route}", json=body,
                                headers={"Authorization": f"Bearer {ep.key}"})  # fmt: skip
    finally:
        await gw.aclose()
    return ep, r


class CannedEngine:
    """An engine whose answer is fixed text (the tiny tokenizer's ids of `text`), each call's
    prompt and sampling params kept (`calls`, `prompts`, `params`); with `width`, the experts
    each position was routed to (learner.routing_replay), as SGLang returns them: prompt +
    output ids but the last."""

    def __init__(self, tok: Any, text: str = "four<|im_end|>", width: int = 0) -> None:
        self.ids = tok.encode(text, add_special_tokens=False)
        self.width, self.calls = width, []

    @property
    def prompts(self) -> list[list[int]]:
        return [ids for ids, _ in self.calls]

    @property
    def params(self) -> list[Any]:
        return [p for _, p in self.calls]

    async def generate(self, input_ids: Any, params: Any, key: Any = None) -> Any:
        import numpy as np

        from agentrl.types import Completion, FinishReason

        self.calls.append((list(input_ids), params))
        n = len(input_ids) + len(self.ids) - 1
        routes = np.arange(n * self.width, dtype=np.int32) if self.width else None
        return Completion(list(self.ids), [-0.5] * len(self.ids), FinishReason.STOP,
                          routed_experts=routes)  # fmt: skip
