"""One place for HTTP to the rollout servers: their addresses and health marks, one pooled aiohttp
session per event loop, a request read whole, an admin call and the fan-out to every server.
The data plane (client.py: `Generation`) and the control plane (admin.py: `Control`) share one.

Every request carries `Authorization: Bearer <api_key>`: the servers and the router a run starts
refuse requests without it (agentrl/engine/config.py says where the token comes from).

HTTP is aiohttp, not httpx: a rollout keeps hundreds of /generate requests in flight, and
httpcore's pool scans every connection on every request, which cost 5-12 ms of client CPU per
request at 256 in flight against 0.3-0.4 ms for aiohttp (measured against an instant loopback
server; `python bench/rollout_overhead.py --http`). orjson reads the logprob-heavy bodies.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

import aiohttp
import orjson

from agentrl.engine.config import default_api_key
from agentrl.engine.protocol import (
    EngineError,
    EngineRequestError,
    EngineUnavailable,
    Reply,
    request_error,
)

FIX_HINT = (
    "start one with `python -m agentrl.engine.dev --model PATH --port PORT` (CPU) or "
    "`python -m sglang.launch_server --model-path PATH --skip-tokenizer-init --port PORT` (GPU), "
    "or fix engine.urls"
)
_JSON_HEADERS = {"Content-Type": "application/json"}


def backoff_delay(attempt: int, base_s: float, cap_s: float, rand: float) -> float:
    """Delay before retry `attempt` (0-based): base * 2**attempt, capped, scaled by 0.5..1."""
    return min(cap_s, base_s * (2**attempt)) * (0.5 + 0.5 * rand)


def health_probe(deep: bool, timeout_s: float) -> tuple[str, float]:
    """The route and timeout of a server health check. /health: a liveness probe, safe on a
    server whose memory is released (SGLang servers agentrl starts are told not to generate in
    it: fleet.server_env). `deep`: /health_generate, a one-token generation that finds a
    scheduler hung behind a live HTTP front; only while the servers hold their memory (a
    generation on a released SGLang server crashes its scheduler)."""
    return ("/health_generate", max(timeout_s, 30.0)) if deep else ("/health", timeout_s)


@dataclass
class Server:
    url: str
    inflight: int = 0
    keys: int = 0  # sticky keys currently mapped here
    down_until: float = 0.0


class Http:
    """The servers (and the router, if any) and one aiohttp session per event loop (train.py may
    call asyncio.run() once per step)."""

    def __init__(
        self,
        urls: list[str],
        router: str | None,
        *,
        timeout_s: float,
        connect_timeout_s: float,
        max_connections: int,
        api_key: str | None,
    ) -> None:
        if not urls:
            raise ValueError("EngineClient needs at least one server URL (engine.urls)")
        self.servers = [Server(u.rstrip("/")) for u in urls]
        # with a router, /generate goes through it (the episode key in ROUTING_KEY_HEADER);
        # admin calls (weights, memory, pause) still go to every server directly
        self.router = Server(router.rstrip("/")) if router else None
        self.timeout_s, self.connect_timeout_s = timeout_s, connect_timeout_s
        self.max_connections = max_connections
        self._auth = {"Authorization": f"Bearer {api_key or default_api_key()}"}
        self._session: aiohttp.ClientSession | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    @property
    def urls(self) -> list[str]:
        return [s.url for s in self.servers]

    async def aclose(self) -> None:
        if self._session is not None and self._loop is asyncio.get_running_loop():
            await self._session.close()
        self._session = None

    def session(self) -> aiohttp.ClientSession:
        loop = asyncio.get_running_loop()
        if self._session is None or self._loop is not loop:
            # sock_connect, not connect: aiohttp's `connect` also counts the wait for a free
            # pooled connection, which a full pool makes long without anything being wrong.
            # Idle connections close after 2 s, before the servers' own 5 s keep-alive
            # (uvicorn's default), so a POST never lands on a socket the server is closing.
            self._session = aiohttp.ClientSession(
                headers=self._auth,
                connector=aiohttp.TCPConnector(
                    limit=self.max_connections, limit_per_host=0, keepalive_timeout=2.0
                ),
                timeout=aiohttp.ClientTimeout(
                    total=self.timeout_s, sock_connect=self.connect_timeout_s
                ),
            )
            self._loop = loop
        return self._session

    async def request(
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
        async with self.session().request(method, url, **kw) as r:
            return Reply(r.status, await r.read())

    async def call(
        self, s: Server, method: str, path: str, body: Any = None, timeout: float | None = None
    ) -> Reply:
        """`request` on one server; an unreachable server is `EngineUnavailable`."""
        try:
            return await self.request(method, s.url + path, body, timeout)
        except (aiohttp.ClientError, TimeoutError) as e:
            what = f"{type(e).__name__}: {e}".strip().rstrip(":")
            raise EngineUnavailable(f"{s.url}{path}: {what}; {FIX_HINT}") from e

    async def admin(self, s: Server, method: str, path: str, body: Any = None) -> Any:
        """An admin call: its JSON (or text); a 4xx or `success: false` raises."""
        r = await self.call(s, method, path, body)
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

    async def fanout(self, method: str, path: str, bodies: list[Any] | Any = None) -> list[Any]:
        """The admin call on every server at once (one body each, or the same for all)."""
        if not isinstance(bodies, list):
            bodies = [bodies] * len(self.servers)
        if len(bodies) != len(self.servers):
            raise ValueError(
                f"{path}: {len(bodies)} request bodies for {len(self.servers)} servers"
            )
        results = await asyncio.gather(
            *(self.admin(s, method, path, b) for s, b in zip(self.servers, bodies, strict=True)),
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
