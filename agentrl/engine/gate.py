"""When /generate may run, and how a turn cut short by a weight push goes on afterwards.

A weight push must not serve a turn from half-updated weights (a push of several buckets is
several requests), so `EngineClient.exclusive()` closes the gate: new turns wait at it. What
happens to the turns already in flight depends on `pause`:

- `pause=False` (sync training, restarts): they finish first, then the body runs.
- `pause=True` (async training, `trainer.async.partial_rollouts`): every request in flight is
  aborted (`/abort_request`, abort_all), which returns it at once with the ids and logprobs
  sampled so far, and the servers are paused (`/pause_generation`, abort mode: nothing is left to abort).
  The body (the push) runs; `/continue_generation` then lets the servers go on, and each cut
  turn is sent again as prompt + what it had sampled, for the tokens it had left, under the new
  weights. The caller gets one `Completion` whose
  `segments` say which tokens came from which weight version; nothing is re-sampled and no
  logprob is recomputed. A request that reached a server after the pause waits there and runs
  wholly under the new weights (SGLang holds it at its pause condition, the dev server in its
  queue), so no completion mixes versions without saying so.

Why abort and not SGLang's other modes: `retract` re-prefills cut requests under the new weights
and `in_place` keeps their old KV cache, and in both the response carries one weight version for
tokens sampled under two, so the learner could not tell how stale each token is.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable

from agentrl.types import Completion


class Gate:
    """Counts the generate() calls in flight and holds new ones while a push has the engines.

    Events belong to one event loop; train.py may run several loops in turn, so they are
    re-made when the loop changes."""

    def __init__(self) -> None:
        self.active = 0  # generate() requests in flight
        self.pauses = 0  # pausing pushes so far: a request sees whether one cut it
        self._loop: asyncio.AbstractEventLoop | None = None
        self._open = asyncio.Event()
        self._idle = asyncio.Event()

    def _events(self) -> tuple[asyncio.Event, asyncio.Event]:
        loop = asyncio.get_running_loop()
        if self._loop is not loop:
            self._loop, self._open, self._idle = loop, asyncio.Event(), asyncio.Event()
            self._open.set()
            if self.active == 0:
                self._idle.set()
        return self._open, self._idle

    @contextlib.asynccontextmanager
    async def request(self) -> AsyncIterator[int]:
        """One /generate request: waits while the gate is closed; yields the pause count, so
        `cut(count)` afterwards says whether a pausing push cut this request short."""
        opened, idle = self._events()
        while not opened.is_set():
            await opened.wait()
        self.active += 1
        idle.clear()
        try:
            yield self.pauses
        finally:
            self.active -= 1
            if self.active == 0:
                idle.set()

    def cut(self, pauses_before: int) -> bool:
        return self.pauses != pauses_before

    @contextlib.asynccontextmanager
    async def closed(
        self,
        cut: Callable[[], Awaitable[object]] | None = None,
        pause: Callable[[], Awaitable[object]] | None = None,
        resume: Callable[[], Awaitable[object]] | None = None,
    ) -> AsyncIterator[int]:
        """No request starts while the body runs. Without `cut`, the ones in flight finish
        first. With it, `cut()` (abort them all) is sent every 20 ms (doubling to 0.5 s) until
        every one has come back, then `pause()`, the body, `resume()`. SGLang's own abort-mode
        pause does the same with a 1 s sleep after its first abort, which cost a whole second
        per push on an H100. Yields how many requests were in flight when the gate closed."""
        opened, idle = self._events()
        opened.clear()
        paused = False
        try:
            inflight = self.active
            if cut is not None and inflight:
                self.pauses += 1
                wait_s = 0.02
                while self.active:
                    await cut()
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(idle.wait(), wait_s)
                    wait_s = min(2 * wait_s, 0.5)
                if pause is not None:
                    await pause()
                    paused = True
            else:
                await idle.wait()
            yield inflight
        finally:
            try:
                if paused and resume is not None:
                    await resume()
            finally:
                opened.set()


def join(parts: list[Completion]) -> Completion:
    """One completion from the pieces of a turn that weight pushes cut: ids and logprobs in
    order, the first piece's version as `weight_version` (the oldest: staleness is counted from
    it) and `segments` = (tokens, version) per piece when there are several versions."""
    last = parts[-1]
    if len(parts) == 1:
        return last
    kept = [p for p in parts if p.token_ids] or [last]
    segments: list[tuple[int, str]] = []
    for p in kept:
        if segments and segments[-1][1] == p.weight_version:
            segments[-1] = (segments[-1][0] + len(p.token_ids), p.weight_version)
        else:
            segments.append((len(p.token_ids), p.weight_version))
    return Completion(
        token_ids=[t for p in parts for t in p.token_ids],
        logprobs=[x for p in parts for x in p.logprobs],
        finish_reason=last.finish_reason,
        weight_version=kept[0].weight_version,
        prompt_tokens=parts[0].prompt_tokens,
        cached_tokens=parts[0].cached_tokens,
        matched_stop=last.matched_stop,
        server=last.server,
        latency_s=sum(p.latency_s for p in parts),
        segments=segments if len(segments) > 1 else [],
        routed_experts=last.routed_experts,  # its request held the earlier pieces' ids
    )
