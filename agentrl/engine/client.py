"""Async client for SGLang's HTTP protocol (and `agentrl.engine.dev`, which speaks the same subset).

    async with EngineClient(["http://127.0.0.1:30000"]) as engine:
        await engine.wait_healthy()
        comp = await engine.generate(prompt_ids, SamplingParams(max_new_tokens=256), key=episode_id)
        engine.release(episode_id)                      # the episode is over: forget its server
        await engine.update_weights_from_disk("/ckpt/step_10", weight_version="10")

Servers run with `--skip-tokenizer-init`: requests carry `input_ids`, responses carry `output_ids`
and `meta_info` (no text). Generation is routed to the least-loaded server (requests in flight);
a `key` (one trajectory) sticks to the server it first landed on, so later turns hit that
server's prefix cache. Connection errors, dropped connections and 5xx are retried with
exponential backoff on another healthy server; a 400 is never retried (`PromptTooLong` when the
prompt does not fit the model's context, `EngineRequestError` otherwise). Admin calls (health,
weights, memory, pause) fan out to every server at once. The wire format (sampling params,
responses, stop tokens, error bodies) is `agentrl.engine.protocol`. Every request carries
`Authorization: Bearer <api_key>`: the servers and the router a run starts refuse requests
without it (agentrl/engine/config.py says where the token comes from).

HTTP is aiohttp, not httpx: a rollout keeps hundreds of /generate requests in flight, and
httpcore's pool scans every connection on every request, which cost 5-12 ms of client CPU per
request at 256 in flight against 0.3-0.4 ms for aiohttp (measured against an instant loopback
server; `python bench/rollout_overhead.py --http`). orjson reads the logprob-heavy bodies.

"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
import uuid
from contextlib import suppress
from dataclasses import dataclass
from typing import Any, Literal

import aiohttp
import orjson

from agentrl.engine.coalesce import Coalescer
from agentrl.engine.config import EngineConfig, default_api_key
from agentrl.engine.gate import Gate, join
from agentrl.engine.protocol import (
    ROUTING_KEY_HEADER,
    EngineError,
    EngineProtocolError,
    EngineRequestError,
    EngineUnavailable,
    PromptTooLong,
    Reply,
    SamplingParams,
    encode_named_tensors,
    error_message,
    parse_generate_response,
    request_error,
)
from agentrl.types import Completion, FinishReason

__all__ = [  # the wire-format names stay importable from here, as before agentrl.engine.protocol
    "EngineClient", "EngineConfig", "EngineError", "EngineProtocolError", "EngineRequestError",
    "EngineUnavailable", "PromptTooLong", "SamplingParams", "backoff_delay",
    "encode_named_tensors", "parse_generate_response",
]  # fmt: skip

log = logging.getLogger(__name__)

FIX_HINT = (
    "start one with `python -m agentrl.engine.dev --model PATH --port PORT` (CPU) or "
    "`python -m sglang.launch_server --model-path PATH --skip-tokenizer-init --port PORT` (GPU), "
    "or fix engine.urls"
)
_CLIENT_FIELDS = {
    "timeout_s", "connect_timeout_s", "max_retries", "backoff_s", "max_backoff_s",
    "unhealthy_cooldown_s", "health_timeout_s", "max_connections", "batch_window_ms",
    "batch_max_wait_ms",
}  # fmt: skip
_JSON_HEADERS = {"Content-Type": "application/json"}


def backoff_delay(attempt: int, base_s: float, cap_s: float, rand: float) -> float:
    """Delay before retry `attempt` (0-based): base * 2**attempt, capped, scaled by 0.5..1."""
    return min(cap_s, base_s * (2**attempt)) * (0.5 + 0.5 * rand)


@dataclass
class _Server:
    url: str
    inflight: int = 0
    keys: int = 0  # sticky keys currently mapped here
    down_until: float = 0.0


def health_probe(deep: bool, timeout_s: float) -> tuple[str, float]:
    """The route and timeout of a server health check. /health: a liveness probe, safe on a
    server whose memory is released (SGLang servers agentrl starts are told not to generate in
    it: servers.server_env). `deep`: /health_generate, a one-token generation that finds a
    scheduler hung behind a live HTTP front; only while the servers hold their memory (a
    generation on a released SGLang server crashes its scheduler)."""
    return ("/health_generate", max(timeout_s, 30.0)) if deep else ("/health", timeout_s)


class EngineClient:
    """Routes /generate over several servers; fans admin calls out to all of them.

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
        process's run token (what the servers `agentrl.engine.fleet` starts here take)."""
        if not urls:
            raise ValueError("EngineClient needs at least one server URL (engine.urls)")
        self._servers = [_Server(u.rstrip("/")) for u in urls]
        # with a router, /generate goes through it (the episode key in ROUTING_KEY_HEADER);
        # admin calls (weights, memory, pause) still go to every server directly
        self._router = _Server(router.rstrip("/")) if router else None
        # engine.batch_window_ms: concurrent /generate calls to one server leave as one request
        self.coalescer = Coalescer(self, batch_window_ms, batch_max_wait_ms)
        self.gate = Gate()  # holds /generate while exclusive() runs (weight pushes)
        self._sticky: dict[str, _Server] = {}
        self.timeout_s, self.connect_timeout_s = timeout_s, connect_timeout_s
        self.max_retries, self.backoff_s, self.max_backoff_s = max_retries, backoff_s, max_backoff_s
        self.unhealthy_cooldown_s, self.health_timeout_s = unhealthy_cooldown_s, health_timeout_s
        self.max_connections = max_connections
        self._auth = {"Authorization": f"Bearer {api_key or default_api_key()}"}
        self._http: aiohttp.ClientSession | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._background: set[asyncio.Task] = set()
        # the LoRA adapter every /generate names (`lora_path`), set by the adapter push
        # (agentrl/learner/sync/adapter.py); None: the served weights as they are
        self.lora: str | None = None

    @classmethod
    def from_config(cls, cfg: EngineConfig, **kw: Any) -> EngineClient:
        fields = cfg.model_dump(include=_CLIENT_FIELDS)
        return cls(cfg.server_urls(), **fields, **{"api_key": cfg.token(), **kw})

    @property
    def urls(self) -> list[str]:
        return [s.url for s in self._servers]

    @property
    def router(self) -> str | None:
        return self._router.url if self._router else None

    @property
    def inflight(self) -> dict[str, int]:
        return {s.url: s.inflight for s in self._servers}

    def server_for(self, key: str) -> str | None:
        s = self._sticky.get(key)
        return s.url if s else None

    async def __aenter__(self) -> EngineClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        if self._http is not None and self._loop is asyncio.get_running_loop():
            await self._http.close()
        self._http = None

    def _client(self) -> aiohttp.ClientSession:
        loop = asyncio.get_running_loop()
        if self._http is None or self._loop is not loop:
            # sock_connect, not connect: aiohttp's `connect` also counts the wait for a free
            # pooled connection, which a full pool makes long without anything being wrong.
            # Idle connections close after 2 s, before the servers' own 5 s keep-alive
            # (uvicorn's default), so a POST never lands on a socket the server is closing.
            self._http = aiohttp.ClientSession(
                headers=self._auth,
                connector=aiohttp.TCPConnector(
                    limit=self.max_connections, limit_per_host=0, keepalive_timeout=2.0
                ),
                timeout=aiohttp.ClientTimeout(
                    total=self.timeout_s, sock_connect=self.connect_timeout_s
                ),
            )
            self._loop = loop
        return self._http

    async def _request(
        self,
        method: str,
        url: str,
        body: Any = None,
        timeout: float | None = None,
        headers: dict[str, str] | None = None,
    ) -> Reply:
        """One HTTP exchange, read whole. Raises aiohttp.ClientError / TimeoutError."""
        kw: dict[str, Any] = {}
        if body is not None:
            kw["data"], kw["headers"] = orjson.dumps(body), {**_JSON_HEADERS, **(headers or {})}
        if timeout is not None:
            kw["timeout"] = aiohttp.ClientTimeout(total=timeout, sock_connect=timeout)
        async with self._client().request(method, url, **kw) as r:
            return Reply(r.status, await r.read())

    # -- generation ----------------------------------------------------------------------------

    def release(self, key: str) -> None:
        """Forget the server a trajectory stuck to (call when the episode ends)."""
        s = self._sticky.pop(key, None)
        if s is not None:
            s.keys -= 1

    def _stick(self, key: str, s: _Server) -> None:
        old = self._sticky.get(key)
        if old is s:
            return
        if old is not None:
            old.keys -= 1
        self._sticky[key] = s
        s.keys += 1

    def _pick(self, key: str | None, tried: list[_Server]) -> _Server:
        if self._router is not None:
            return self._router
        now = time.monotonic()
        fresh = [s for s in self._servers if s not in tried] or self._servers
        healthy = [s for s in fresh if s.down_until <= now] or fresh
        sticky = self._sticky.get(key) if key is not None else None
        if sticky is not None and sticky in healthy:
            return sticky
        return min(healthy, key=lambda s: (s.inflight, s.keys))

    async def generate(
        self, input_ids: list[int], params: SamplingParams, key: str | None = None
    ) -> Completion:
        """Sample a completion of `input_ids`. `key` pins one trajectory to one server. Waits
        while `exclusive()` holds the engines (a weight update in progress). A turn that a
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

    @contextlib.asynccontextmanager
    async def exclusive(self, pause: bool = False):
        """No /generate runs while the body runs: new calls wait. Calls in flight finish first,
        or with `pause` are cut at once (/abort_request, then /pause_generation) and go on under
        the new weights after the body (/continue_generation). Weight pushes go through here, so
        no turn is sampled with half-updated weights (a push of several buckets is several
        requests) and every token's version is known. Yields how many calls were in flight."""
        cut = (lambda: self.abort(abort_all=True), lambda: self.pause_generation("abort"),
               self.continue_generation) if pause else ()  # fmt: skip
        async with self.gate.closed(*cut) as inflight:
            yield inflight

    async def _generate(
        self, input_ids: list[int], params: SamplingParams, key: str | None
    ) -> Completion:
        payload: dict[str, Any] = {
            "input_ids": list(input_ids),
            "sampling_params": params.to_sglang(),
            "return_logprob": True,
        }
        if self.lora is not None:
            payload["lora_path"] = self.lora
        tried: list[_Server] = []
        errors: list[str] = []
        headers = {ROUTING_KEY_HEADER: key} if key is not None and self._router else None
        for attempt in range(self.max_retries + 1):
            s = self._pick(key, tried)
            if key is not None and self._router is None:
                self._stick(key, s)
            payload["rid"] = uuid.uuid4().hex
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
            f"({', '.join(self.urls)}); last error: {errors[-1]}; {FIX_HINT}"
        )

    async def _try_generate(
        self,
        s: _Server,
        payload: dict[str, Any],
        headers: dict[str, str] | None = None,
        batch: bool = True,
    ) -> Completion | str:
        """One attempt: a Completion, or the reason it is worth retrying elsewhere."""
        if batch and self.coalescer.on and s is not self._router:
            return await self.coalescer.submit(s, payload)
        s.inflight += 1
        t0 = time.monotonic()
        try:
            r = await self._request("POST", s.url + "/generate", payload, headers=headers)
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

    def _abort_later(self, s: _Server, rid: str) -> None:
        task = asyncio.create_task(self._abort_quietly(s, rid))
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _abort_quietly(self, s: _Server, rid: str) -> None:
        # the router does not pass /abort_request on; the rid is unique, so ask every server
        targets = self._servers if s is self._router else [s]
        for t in targets:
            with suppress(aiohttp.ClientError, TimeoutError):
                await self._request(
                    "POST", t.url + "/abort_request", {"rid": rid}, timeout=self.connect_timeout_s
                )

    # -- admin fan-out -------------------------------------------------------------------------

    async def _call(
        self, s: _Server, method: str, path: str, body: Any = None, timeout: float | None = None
    ) -> Reply:
        try:
            return await self._request(method, s.url + path, body, timeout)
        except (aiohttp.ClientError, TimeoutError) as e:
            what = f"{type(e).__name__}: {e}".strip().rstrip(":")
            raise EngineUnavailable(f"{s.url}{path}: {what}; {FIX_HINT}") from e

    async def _admin(self, s: _Server, method: str, path: str, body: Any = None) -> Any:
        r = await self._call(s, method, path, body)
        if r.status >= 400:
            raise request_error(r, s.url, path)
        try:
            data = r.json()
        except ValueError:
            return r.text
        if isinstance(data, dict) and data.get("success") is False:
            msg = data.get("message") or data.get("error_message")  # the latter: LoRA routes
            raise EngineRequestError(f"{s.url}{path}: {msg}", r.status, s.url)
        return data

    async def _fanout(self, method: str, path: str, bodies: list[Any] | Any = None) -> list[Any]:
        if not isinstance(bodies, list):
            bodies = [bodies] * len(self._servers)
        if len(bodies) != len(self._servers):
            raise ValueError(
                f"{path}: {len(bodies)} request bodies for {len(self._servers)} servers"
            )
        results = await asyncio.gather(
            *(self._admin(s, method, path, b) for s, b in zip(self._servers, bodies, strict=True)),
            return_exceptions=True,
        )
        failed = [r for r in results if isinstance(r, BaseException)]
        if failed:
            if all(isinstance(r, EngineUnavailable) for r in failed):
                raise failed[0]
            raise EngineError(
                f"{path} failed on {len(failed)}/{len(results)} servers: "
                + "; ".join(str(r) for r in failed)
            )
        return results

    async def health(self, deep: bool = False) -> dict[str, bool]:
        """Per server (and the router): answers its health probe (`health_probe`) with 200."""

        async def one(s: _Server) -> bool:
            path, timeout = health_probe(deep and s is not self._router, self.connect_timeout_s)
            try:
                r = await self._call(s, "GET", path, timeout=timeout)
            except EngineUnavailable:
                return False
            return r.status == 200

        every = [*self._servers, *([self._router] if self._router else [])]
        oks = await asyncio.gather(*(one(s) for s in every))
        return dict(zip([s.url for s in every], oks, strict=True))

    async def wait_healthy(self, timeout_s: float | None = None, poll_s: float = 0.5) -> None:
        """Block until every server answers /health with 200."""
        deadline = time.monotonic() + (timeout_s or self.health_timeout_s)
        while True:
            status = await self.health()
            down = [u for u, ok in status.items() if not ok]
            if not down:
                for s in self._servers:
                    s.down_until = 0.0
                return
            if time.monotonic() >= deadline:
                raise EngineUnavailable(
                    f"engine servers not healthy after {timeout_s or self.health_timeout_s:g}s: "
                    f"{', '.join(down)}; {FIX_HINT}"
                )
            await asyncio.sleep(poll_s)

    async def _get_with_fallback(self, path: str, old_path: str) -> list[Any]:
        try:
            return await self._fanout("GET", path)
        except EngineError as e:  # SGLang renamed /get_model_info -> /model_info (2026)
            if "HTTP 404" not in str(e):
                raise
            return await self._fanout("GET", old_path)

    async def model_info(self) -> list[dict[str, Any]]:
        return await self._get_with_fallback("/model_info", "/get_model_info")

    async def server_info(self) -> list[dict[str, Any]]:
        return await self._get_with_fallback("/server_info", "/get_server_info")

    async def get_weight_version(self) -> list[str]:
        """Per server, the version its weights carry: /model_info's `weight_version` (SGLang
        0.5.17 answers /get_weight_version with a 404), else the older route."""
        info = await self.model_info()
        if all("weight_version" in r for r in info):
            return [str(r["weight_version"]) for r in info]
        res = await self._fanout("GET", "/get_weight_version")
        return [str(r["weight_version"]) for r in res]

    async def update_weight_version(self, new_version: str, abort_all_requests: bool = True):
        body = {"new_version": new_version, "abort_all_requests": abort_all_requests}
        return await self._fanout("POST", "/update_weight_version", body)

    async def flush_cache(self) -> list[bool]:
        """True per server that flushed; SGLang refuses (400) while requests are running."""
        rs = await asyncio.gather(*(self._call(s, "POST", "/flush_cache") for s in self._servers))
        return [r.status == 200 for r in rs]

    async def abort(self, rid: str | None = None, abort_all: bool = False) -> list[Any]:
        return await self._fanout(
            "POST", "/abort_request", {"rid": rid or "", "abort_all": abort_all}
        )

    async def pause_generation(self, mode: Literal["abort", "retract", "in_place"] = "abort"):
        return await self._fanout("POST", "/pause_generation", {"mode": mode})

    async def continue_generation(self) -> list[Any]:
        return await self._fanout("POST", "/continue_generation", {})

    async def load_lora_adapter(self, name: str, path: str) -> list[Any]:
        """Every server loads the PEFT adapter dir `path` as `name` (SGLang: --enable-lora)."""
        return await self._fanout(
            "POST", "/load_lora_adapter", {"lora_name": name, "lora_path": str(path)}
        )

    async def unload_lora_adapter(self, name: str) -> list[Any]:
        return await self._fanout("POST", "/unload_lora_adapter", {"lora_name": name})

    async def release_memory_occupation(self, tags: list[str] | None = None) -> list[Any]:
        return await self._fanout("POST", "/release_memory_occupation", {"tags": tags})

    async def resume_memory_occupation(self, tags: list[str] | None = None) -> list[Any]:
        return await self._fanout("POST", "/resume_memory_occupation", {"tags": tags})

    async def update_weights_from_disk(
        self, model_path: str, weight_version: str | None = None, **extra: Any
    ) -> list[Any]:
        """Reload from a checkpoint dir. `extra`: more SGLang fields (load_format, ...)."""
        body = {"model_path": str(model_path), "weight_version": weight_version, **extra}
        return await self._fanout("POST", "/update_weights_from_disk", body)

    async def init_weights_update_group(
        self,
        master_address: str,
        master_port: int,
        *,
        group_name: str = "weight_update_group",
        backend: str = "nccl",
        ranks_per_server: int = 1,
    ) -> list[Any]:
        """Every server joins the trainer's group: trainer rank 0, server i ranks from
        1 + i * ranks_per_server. Blocks until the group forms, so the trainer must join
        (rank 0, world_size = 1 + n * ranks_per_server) concurrently."""
        world_size = 1 + len(self._servers) * ranks_per_server
        common = {
            "master_address": master_address,
            "master_port": master_port,
            "world_size": world_size,
            "group_name": group_name,
            "backend": backend,
        }
        bodies = [
            {"rank_offset": 1 + i * ranks_per_server, **common} for i in range(len(self._servers))
        ]
        return await self._fanout("POST", "/init_weights_update_group", bodies)

    async def update_weights_from_distributed(
        self,
        names: list[str],
        dtypes: list[Any],
        shapes: list[list[int]],
        *,
        group_name: str = "weight_update_group",
        weight_version: str | None = None,
        **extra: Any,
    ) -> list[Any]:
        """Servers receive `names` by broadcast from rank 0, in this order; the trainer must
        broadcast them concurrently with this call. `extra`: flush_cache, abort_all_requests."""
        body = {
            "names": list(names),
            "dtypes": [str(d).removeprefix("torch.") for d in dtypes],
            "shapes": [list(s) for s in shapes],
            "group_name": group_name,
            "weight_version": weight_version,
            **extra,
        }
        return await self._fanout("POST", "/update_weights_from_distributed", body)

    async def destroy_weights_update_group(self, group_name: str = "weight_update_group"):
        return await self._fanout(
            "POST", "/destroy_weights_update_group", {"group_name": group_name}
        )

    async def update_weights_from_tensor(
        self,
        serialized_named_tensors: list[str] | list[list[str]],
        weight_version: str | None = None,
        **extra: Any,
    ) -> list[Any]:
        """`serialized_named_tensors`: one payload per server rank (SGLang: per TP rank), or a
        list of such lists, one per server. Dev server payloads: `encode_named_tensors`.
        `extra`: load_format, flush_cache, abort_all_requests."""
        payloads = serialized_named_tensors
        if not (payloads and isinstance(payloads[0], list)):
            payloads = [payloads] * len(self._servers)
        common = {"weight_version": weight_version, **extra}
        bodies = [{"serialized_named_tensors": p, **common} for p in payloads]
        return await self._fanout("POST", "/update_weights_from_tensor", bodies)
