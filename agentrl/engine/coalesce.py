"""Coalescing (`engine.batch_window_ms`, off by default): the /generate calls that reach one
server close together leave as ONE batched request (SGLang's list form) — one HTTP request and
one scheduler admission for a wave of turns. A batch leaves once no call joined it for the window
(a wave the client issues one by one stays together), at most `batch_max_wait_ms` after its first
call. Each caller gets exactly what its own request would have given: its completion, its retry
reason (timeouts, connection errors, 5xx: for every member), or its own error (a member the
server refuses is sent again alone, so the others do not share its fate). The price: a batch
answers when its slowest member is done.

A batch's answers are handed out `SETTLE_CHUNK` at a time, the event loop let run between: the
first members answered compute their next turn and join the next wave, which leaves (at
`batch_max_wait_ms`) while later members are still being answered. Handed out all at once, every
member's turn ran in one loop iteration before any next request could leave, so the client's
whole work on a wave of returning turns (about 0.7 ms a turn: 180 ms for 256 episodes) stood
between the server finishing one turn and starting the next. Measured in docs/benchmarks.md."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from agentrl.engine.protocol import (
    EngineProtocolError,
    error_message,
    parse_generate_response,
    request_error,
)
from agentrl.types import Completion

SETTLE_CHUNK = 16  # members answered per event-loop iteration (see the module docstring)


@dataclass
class _Wave:
    """The calls waiting to leave for one server, the timer that sends them, when the first
    arrived."""

    pending: list[tuple[dict[str, Any], asyncio.Future]] = field(default_factory=list)
    timer: asyncio.TimerHandle | None = None
    started: float = 0.0


class Coalescer:
    """Batches /generate calls per server for a `Generation` (client.py; its `http.request`,
    `_abort_later`, `_try_generate` and `_background` are used as they are)."""

    def __init__(self, client: Any, window_ms: float, max_wait_ms: float) -> None:
        self.client = client
        self.window_s = window_ms / 1000.0
        self.max_wait_s = max(max_wait_ms / 1000.0, self.window_s)
        self.waves: dict[str, _Wave] = {}
        self.batches_sent = self.batched_calls = 0  # coalescing at work: calls / batches
        self.settle_chunk = SETTLE_CHUNK

    @property
    def on(self) -> bool:
        return self.window_s > 0

    async def submit(self, s: Any, payload: dict[str, Any]) -> Completion | str:
        """Join server `s`'s next batch; the same outcome as `Generation._try_generate`."""
        loop = asyncio.get_running_loop()
        wave = self.waves.setdefault(s.url, _Wave())
        fut: asyncio.Future = loop.create_future()
        wave.pending.append((dict(payload), fut))
        now = loop.time()
        if len(wave.pending) == 1:
            wave.started = now
        when = min(now + self.window_s, wave.started + self.max_wait_s)
        # the window only moves later: a call that joins past the wait bound leaves the due timer
        # as it is (re-armed, it went behind every call already queued in the loop, and a long
        # wave of joiners kept cancelling it until the last one)
        if wave.timer is None or when > wave.timer.when():
            if wave.timer is not None:
                wave.timer.cancel()
            wave.timer = loop.call_at(when, self._send, s)
        try:
            return await fut
        except asyncio.CancelledError:
            if not any(f is fut for _, f in wave.pending):  # already sent: stop sampling it
                self.client._abort_later(s, payload["rid"])
            raise

    def _send(self, s: Any) -> None:
        wave = self.waves[s.url]
        items = [(p, f) for p, f in wave.pending if not f.done()]  # cancelled ones never leave
        wave.pending, wave.timer = [], None
        if items:
            self.batches_sent += 1
            self.batched_calls += len(items)
            task = asyncio.create_task(self._post(s, items))
            self.client._background.add(task)
            task.add_done_callback(self.client._background.discard)

    async def _post(self, s: Any, items: list[tuple[dict[str, Any], asyncio.Future]]) -> None:
        def settle(results: list[Any]) -> None:
            _settle(items, results)

        body = {
            "input_ids": [p["input_ids"] for p, _ in items],
            "sampling_params": [p["sampling_params"] for p, _ in items],
            "rid": [p["rid"] for p, _ in items],
            "return_logprob": True,
        }
        if any("lora_path" in p for p, _ in items):
            body["lora_path"] = [p.get("lora_path") for p, _ in items]
        if any(p.get("return_routed_experts") for p, _ in items):
            body["return_routed_experts"] = True
        s.inflight += len(items)
        t0 = time.monotonic()
        try:
            r = await self.client.http.request("POST", s.url + "/generate", body)
        except TimeoutError:
            for p, _ in items:
                self.client._abort_later(s, p["rid"])
            return settle([f"timed out after {time.monotonic() - t0:.1f}s"] * len(items))
        except aiohttp.ClientError as e:
            return settle([f"{type(e).__name__}: {e}".strip()] * len(items))
        except Exception as e:  # noqa: BLE001 - re-raised in every waiting caller
            return settle([e] * len(items))
        finally:
            s.inflight -= len(items)
        if r.status >= 500:
            return settle([f"HTTP {r.status}: {error_message(r)[:200]}"] * len(items))
        if r.status >= 400 and len(items) > 1:
            alone = (self.client._try_generate(s, p, batch=False) for p, _ in items)
            return settle(list(await asyncio.gather(*alone, return_exceptions=True)))
        if r.status >= 400:
            return settle([request_error(r, s.url, "/generate")])
        s.down_until = 0.0
        try:
            data = r.json()
            if not isinstance(data, list) or len(data) != len(items):
                raise ValueError(f"expected a list of {len(items)} answers")
            latency = time.monotonic() - t0
            results: list[Any] = []
            for d in data:
                try:
                    results.append(parse_generate_response(d, s.url, latency))
                except EngineProtocolError as e:
                    results.append(e)
        except ValueError as e:
            results = [EngineProtocolError(f"{s.url}/generate (batched): {e}")] * len(items)
        await self._answer(items, results)

    async def _answer(self, items: list[tuple[Any, asyncio.Future]], results: list[Any]) -> None:
        """Each member its result, `settle_chunk` at a time with the loop let run between (the
        module docstring says why)."""
        try:
            for i in range(0, len(items), self.settle_chunk):
                if i:
                    await asyncio.sleep(0)  # the members answered so far run their turns first
                _settle(items[i : i + self.settle_chunk], results[i : i + self.settle_chunk])
        finally:  # cancelled between chunks: nobody is left waiting
            _settle(items, results)


def _settle(items: list[tuple[Any, asyncio.Future]], results: list[Any]) -> None:
    """Each waiting member its result: a Completion, a retry reason, or an exception."""
    for (_, f), res in zip(items, results, strict=True):
        if not f.done():
            if isinstance(res, BaseException):
                f.set_exception(res)
            else:
                f.set_result(res)
