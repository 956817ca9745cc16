"""Async client for SGLang's HTTP protocol (and `agentrl.engine.dev`, which speaks the same subset).

    async with EngineClient(["http://127.0.0.1:30000"]) as engine:
        await engine.control.wait_healthy()
        comp = await engine.generate(prompt_ids, SamplingParams(max_new_tokens=256), key=episode_id)
        engine.release(episode_id)                      # the episode is over: forget its server
        await engine.control.update_weights_from_disk("/ckpt/step_10", weight_version="10")

Two planes over one `Http` (http.py: the session, retries' delays, the fan-out): `engine.gen`, the
data plane here (generate, abort, routing), and `engine.control`, the control plane (admin.py:
health, versions, pause, memory, LoRA, weight updates). `EngineClient` holds both and the push
gate between them (`exclusive`).

Servers run with `--skip-tokenizer-init`: requests carry `input_ids`, responses carry `output_ids`
and `meta_info` (no text). Generation is routed to the least-loaded server (requests in flight);
a `key` (one trajectory) sticks to the server it first landed on, so later turns hit that
server's prefix cache. Connection errors, dropped connections and 5xx are retried with
exponential backoff on another healthy server; a 400 is never retried (`PromptTooLong` when the
prompt does not fit the model's context, `EngineRequestError` otherwise). The wire format
(sampling params, responses, stop tokens, error bodies) is agentrl/engine/protocol.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import random
import time
import uuid
from contextlib import suppress
from typing import Any

import aiohttp

from agentrl.engine.admin import Control
from agentrl.engine.coalesce import Coalescer
from agentrl.engine.config import EngineConfig
from agentrl.engine.gate import Gate, join
from agentrl.engine.http import FIX_HINT, Endpoint, Http, Server, backoff_delay
from agentrl.engine.protocol import (
    ROUTING_KEY_HEADER,
    EngineProtocolError,
    EngineRequestError,
    EngineUnavailable,
    SamplingParams,
    error_message,
    parse_generate_response,
    request_error,
)
from agentrl.types import Completion, FinishReason

log = logging.getLogger(__name__)

_CLIENT_FIELDS = {
    "timeout_s", "connect_timeout_s", "max_retries", "backoff_s", "max_backoff_s",
    "unhealthy_cooldown_s", "health_timeout_s", "max_connections", "batch_window_ms",
    "batch_max_wait_ms",
}  # fmt: skip


class Generation:
    """The data plane: routes /generate over the servers (or the router), sticks an episode's
    key to one server, retries elsewhere, aborts what its callers gave up on."""

    def __init__(
        self,
        http: Http,
        *,
        max_retries: int = 3,
        backoff_s: float = 0.5,
        max_backoff_s: float = 8.0,
        unhealthy_cooldown_s: float = 5.0,
        batch_window_ms: float = 0.0,
        batch_max_wait_ms: float = 50.0,
    ) -> None:
        self.http = http
        self.max_retries, self.backoff_s, self.max_backoff_s = max_retries, backoff_s, max_backoff_s
        self.unhealthy_cooldown_s = unhealthy_cooldown_s
        # engine.batch_window_ms: concurrent /generate calls to one server leave as one request
        self.coalescer = Coalescer(self, batch_window_ms, batch_max_wait_ms)
        self.gate = Gate()  # holds /generate while EngineClient.exclusive() runs (weight pushes)
        self._sticky: dict[str, Server] = {}
        self._background: set[asyncio.Task] = set()
        # request ids: this client's random prefix and a count (uuid4 per request: 3 us)
        self._rid, self._rids = uuid.uuid4().hex[:16] + "-", itertools.count()
        # the LoRA adapter every /generate names (`lora_path`), set by the adapter push
        # (agentrl/learner/sync/adapter.py); None: the served weights as they are
        self.lora: str | None = None
        # learner.routing_replay: every /generate asks for the experts each position was routed
        # to (return_routed_experts), which the learner's forward then uses
        self.routed_experts = False

    @property
    def inflight(self) -> dict[str, int]:
        return {s.url: s.inflight for s in self.http.servers}

    def server_for(self, key: str) -> str | None:
        s = self._sticky.get(key)
        return s.url if s else None

    def release(self, key: str) -> None:
        """Forget the server a trajectory stuck to (call when the episode ends)."""
        s = self._sticky.pop(key, None)
        if s is not None:
            s.keys -= 1

    def _stick(self, key: str, s: Server) -> None:
        old = self._sticky.get(key)
        if old is s:
            return
        if old is not None:
            old.keys -= 1
        self._sticky[key] = s
        s.keys += 1

    def _pick(self, key: str | None, tried: list[Server]) -> Server:
        if self.http.router is not None:
            return self.http.router
        now = time.monotonic()
        fresh = [s for s in self.http.servers if s not in tried] or self.http.servers
        healthy = [s for s in fresh if s.down_until <= now] or fresh
        sticky = self._sticky.get(key) if key is not None else None
        if sticky is not None and sticky in healthy:
            return sticky
        return min(healthy, key=lambda s: (s.inflight, s.keys))

    async def generate(
        self, input_ids: list[int], params: SamplingParams, key: str | None = None
    ) -> Completion:
        """Sample a completion of `input_ids`. `key` pins one trajectory to one server. Waits
        while `EngineClient.exclusive()` holds the engines (a weight update in progress). A turn that a
        pausing push cut short goes on after it under the new weights: one Completion comes
        back, its `segments` saying which tokens which version sampled (agentrl/engine/gate.py)."""
        parts: list[Completion] = []
        while True:
            sofar = [t for p in parts for t in p.token_ids]
            left = params.max_new_tokens - len(sofar)
            if parts and left <= 0:  # the cut came with the last token: the turn is whole
                parts[-1].finish_reason = FinishReason.LENGTH
                return join(parts)
            ask = params if not parts else params.model_copy(update={"max_new_tokens": left})
            async with self.gate.request() as pauses:
                try:
                    comp = await self._generate([*input_ids, *sofar], ask, key)
                except EngineRequestError as e:
                    # SGLang answers 400 "was aborted" to a request the pause caught before
                    # it reached the scheduler: nothing was sampled, send it again
                    if not (self.gate.cut(pauses) and "aborted" in str(e)):
                        raise
                    comp = Completion([], [], FinishReason.ABORT)
            if comp.finish_reason is FinishReason.ABORT and self.gate.cut(pauses):
                parts.append(comp)
                continue
            return join([*parts, comp])

    async def _generate(
        self, input_ids: list[int], params: SamplingParams, key: str | None
    ) -> Completion:
        payload: dict[str, Any] = {
            "input_ids": input_ids,  # generate's own copy: the episode's ids are not held here
            "sampling_params": params.to_sglang(),
            "return_logprob": True,
        }
        if self.lora is not None:
            payload["lora_path"] = self.lora
        if self.routed_experts:
            payload["return_routed_experts"] = True
        tried: list[Server] = []
        errors: list[str] = []
        headers = {ROUTING_KEY_HEADER: key} if key is not None and self.http.router else None
        for attempt in range(self.max_retries + 1):
            s = self._pick(key, tried)
            if key is not None and self.http.router is None:
                self._stick(key, s)
            payload["rid"] = f"{self._rid}{next(self._rids):x}"
            error = await self._try_generate(s, payload, headers)
            if isinstance(error, Completion):
                return error
            errors.append(f"{s.url}: {error}")
            s.down_until = time.monotonic() + self.unhealthy_cooldown_s
            tried.append(s)
            if attempt < self.max_retries:
                delay = backoff_delay(attempt, self.backoff_s, self.max_backoff_s, random.random())
                log.warning("engine %s failed (%s); retrying in %.2fs", s.url, error, delay)
                await asyncio.sleep(delay)
        raise EngineUnavailable(
            f"no engine server answered /generate after {len(errors)} attempts "
            f"({', '.join(self.http.urls)}); last error: {errors[-1]}; {FIX_HINT}"
        )

    async def _try_generate(
        self,
        s: Server,
        payload: dict[str, Any],
        headers: dict[str, str] | None = None,
        batch: bool = True,
    ) -> Completion | str:
        """One attempt: a Completion, or the reason it is worth retrying elsewhere."""
        if batch and self.coalescer.on and s is not self.http.router:
            return await self.coalescer.submit(s, payload)
        s.inflight += 1
        t0 = time.monotonic()
        try:
            r = await self.http.request("POST", s.url + "/generate", payload, headers=headers)
        except TimeoutError:
            self._abort_later(s, payload["rid"])
            return f"timed out after {time.monotonic() - t0:.1f}s"
        except asyncio.CancelledError:  # the caller gave up (an over-sampled group): free the slot
            self._abort_later(s, payload["rid"])
            raise
        except aiohttp.ClientError as e:
            return f"{type(e).__name__}: {e}".strip()
        finally:
            s.inflight -= 1
        if r.status >= 500:
            return f"HTTP {r.status}: {error_message(r)[:200]}"
        if r.status >= 400:
            raise request_error(r, s.url, "/generate")
        s.down_until = 0.0
        try:
            data = r.json()
        except ValueError as e:
            raise EngineProtocolError(f"{s.url}/generate returned non-JSON: {e}") from e
        return parse_generate_response(data, s.url, time.monotonic() - t0)

    def _abort_later(self, s: Server, rid: str) -> None:
        task = asyncio.create_task(self._abort_quietly(s, rid))
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _abort_quietly(self, s: Server, rid: str) -> None:
        # the router does not pass /abort_request on; the rid is unique, so ask every server
        targets = self.http.servers if s is self.http.router else [s]
        for t in targets:
            with suppress(aiohttp.ClientError, TimeoutError):
                await self.http.request(
                    "POST",
                    t.url + "/abort_request",
                    {"rid": rid},
                    timeout=self.http.connect_timeout_s,
                )

    async def abort(self, rid: str | None = None, abort_all: bool = False) -> list[Any]:
        """/abort_request on every server: one request (`rid`), or all that run."""
        return await self.http.fanout(
            "POST", "/abort_request", {"rid": rid or "", "abort_all": abort_all}
        )


class EngineClient:
    """Both planes over several servers: `gen` (generation), `control` (admin fan-out).

    One pooled aiohttp session per event loop (train.py may call asyncio.run() once per step)."""

    def __init__(
        self,
        urls: list[str],
        *,
        timeout_s: float = 600.0,
        connect_timeout_s: float = 5.0,
        max_retries: int = 3,
        backoff_s: float = 0.5,
        max_backoff_s: float = 8.0,
        unhealthy_cooldown_s: float = 5.0,
        health_timeout_s: float = 300.0,
        max_connections: int = 1024,
        router: str | None = None,
        batch_window_ms: float = 0.0,
        batch_max_wait_ms: float = 50.0,
        api_key: str | None = None,
    ):
        """`api_key`: the servers' Bearer token; None: $AGENTRL_ENGINE_API_KEY, else this
        process's run token (what the servers `agentrl.engine.launch_fleet` starts here take)."""
        self.http = Http(
            urls,
            router,
            timeout_s=timeout_s,
            connect_timeout_s=connect_timeout_s,
            max_connections=max_connections,
            api_key=api_key,
        )
        self.gen = Generation(
            self.http,
            max_retries=max_retries,
            backoff_s=backoff_s,
            max_backoff_s=max_backoff_s,
            unhealthy_cooldown_s=unhealthy_cooldown_s,
            batch_window_ms=batch_window_ms,
            batch_max_wait_ms=batch_max_wait_ms,
        )
        self.control = Control(self.http, health_timeout_s)

    @classmethod
    def from_config(cls, cfg: EngineConfig, **kw: Any) -> EngineClient:
        fields = cfg.model_dump(include=_CLIENT_FIELDS)
        return cls(cfg.server_urls(), **fields, **{"api_key": cfg.token(), **kw})

    @property
    def urls(self) -> list[str]:
        return self.http.urls

    def endpoints(self) -> list[Endpoint]:
        """Every server's admin address with this client's token and timeouts, for a process
        that posts to them itself (a learner rank's weight update: agentrl/learner/sync/)."""
        return self.http.endpoints()

    @property
    def router(self) -> str | None:
        return self.http.router.url if self.http.router else None

    async def __aenter__(self) -> EngineClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self.http.aclose()

    async def generate(
        self, input_ids: list[int], params: SamplingParams, key: str | None = None
    ) -> Completion:
        """`gen.generate`: a rollout's one call."""
        return await self.gen.generate(input_ids, params, key)

    def release(self, key: str) -> None:
        """`gen.release`: the episode is over, forget its server."""
        self.gen.release(key)

    @contextlib.asynccontextmanager
    async def exclusive(self, pause: bool = False):
        """No /generate runs while the body runs: new calls wait. Calls in flight finish first,
        or with `pause` are cut at once (/abort_request, then /pause_generation) and go on under
        the new weights after the body (/continue_generation). Weight pushes go through here, so
        no turn is sampled with half-updated weights (a push of several buckets is several
        requests) and every token's version is known. Yields how many calls were in flight."""
        gen, control = self.gen, self.control
        cut = (lambda: gen.abort(abort_all=True), lambda: control.pause_generation("abort"),
               control.continue_generation) if pause else ()  # fmt: skip
        async with self.gen.gate.closed(*cut) as inflight:
            yield inflight
