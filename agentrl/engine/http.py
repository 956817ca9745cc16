"""One place for HTTP to the rollout servers: their addresses and health marks, one pooled aiohttp
session per event loop, a request read whole, an admin call and the fan-out to every server.
The data plane (client.py: `Generation`) and the control plane (admin.py: `Control`) share one.

Every request carries `Authorization: Bearer <api_key>`: the servers and the router a run starts
refuse requests without it (agentrl/engine/config.py says where the token comes from).

HTTP is aiohttp, not httpx: a rollout keeps hundreds of /generate requests in flight, and
httpcore's pool scans every connection on every request, which cost 5-12 ms of client CPU per
request at 256 in flight against 0.3-0.4 ms for aiohttp (measured against an instant loopback
server; `python bench/rollout_overhead.py --http`). orjson reads the logprob-heavy bodies.

`Endpoint` is one server's admin address as a process without an EngineClient holds it (a
learner rank posting its own weight update, agentrl/learner/sync/tensor.py): the client's URL,
token and timeouts, and a blocking `post_admin` (httpx: one request at a time, no event loop)
with the same checks as `Http.admin`.
"""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import httpx
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
        self.api_key = api_key or default_api_key()
        self._auth = {"Authorization": f"Bearer {self.api_key}"}
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
        return admin_answer(await self.call(s, method, path, body), s.url, path)

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
        return fanout_results(path, results)

    def endpoints(self) -> list[Endpoint]:
        """Every server (not the router) as an `Endpoint`: this client's token and timeouts."""
        return [
            Endpoint(s.url, self.api_key, self.timeout_s, self.connect_timeout_s)
            for s in self.servers
        ]


def admin_answer(r: Reply, url: str, path: str) -> Any:
    """An admin call's JSON (or text); a 4xx or `success: false` raises."""
    if r.status >= 400:
        raise request_error(r, url, path)
    try:
        data = r.json()
    except ValueError:
        return r.text
    if isinstance(data, dict) and data.get("success") is False:
        msg = data.get("message") or data.get("error_message")  # the latter: LoRA routes
        raise EngineRequestError(f"{url}{path}: {msg}", r.status, url)
    return data


def fanout_results(path: str, results: list[Any]) -> list[Any]:
    """The answers of one admin call on several servers; any failure raises: the first
    `EngineUnavailable` when every failure is one, else an EngineError naming them all."""
    failed = [r for r in results if isinstance(r, BaseException)]
    if failed:
        if all(isinstance(r, EngineUnavailable) for r in failed):
            raise failed[0]
        raise EngineError(
            f"{path} failed on {len(failed)}/{len(results)} servers: "
            + "; ".join(str(r) for r in failed)
        )
    return results


@dataclass(frozen=True)
class Endpoint:
    """One server's admin address, token and timeouts (`Http.endpoints`), for a process that
    posts to it without an EngineClient; picklable (a Ray actor receives it)."""

    url: str
    api_key: str = field(repr=False)
    timeout_s: float
    connect_timeout_s: float


def post_admin(client: httpx.Client, server: Endpoint, path: str, body: Any) -> Any:
    """A blocking admin POST with `Http.admin`'s checks and errors (one attempt, no retry; an
    unreachable server is `EngineUnavailable`). `client`: a pooled httpx.Client, kept by the
    caller across requests."""
    headers = {**_JSON_HEADERS, "Authorization": f"Bearer {server.api_key}"}
    timeout = httpx.Timeout(server.timeout_s, connect=server.connect_timeout_s)
    try:
        r = client.post(server.url + path, content=orjson.dumps(body), headers=headers,
                        timeout=timeout)  # fmt: skip
    except httpx.HTTPError as e:
        what = f"{type(e).__name__}: {e}".strip().rstrip(":")
        raise EngineUnavailable(f"{server.url}{path}: {what}; {FIX_HINT}") from e
    return admin_answer(Reply(r.status_code, r.content), server.url, path)


def post_each(client: httpx.Client, path: str, calls: list[tuple[Endpoint, Any]]) -> list[Any]:
    """`post_admin` to several servers at once (a thread each), failing as `Http.fanout` does."""
    if len(calls) <= 1:
        return [post_admin(client, server, path, body) for server, body in calls]

    def one(call: tuple[Endpoint, Any]) -> Any:
        try:
            return post_admin(client, call[0], path, call[1])
        except EngineError as e:
            return e

    with ThreadPoolExecutor(len(calls)) as pool:
        return fanout_results(path, list(pool.map(one, calls)))
