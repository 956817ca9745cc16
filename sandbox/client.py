"""ServiceSandbox: the async client of the local sandbox service (`python -m sandbox.server`).

    from sandbox import ServiceSandbox
    sb = ServiceSandbox("http://127.0.0.1:8470")
    await sb.run("x = 2", session="traj-17")
    res = await sb.run("print(x * 21)", session="traj-17")   # res.stdout == "42\\n"
    await sb.close_session("traj-17")
    await sb.aclose()

Failure semantics: an unreachable service or a 503 "busy"/"unavailable" answer (the service
says the code did not run) is retried with exponential backoff and jitter (`retries`,
`backoff_s`, `backoff_max_s`; a Retry-After header is honoured); when retries run out `run`
raises `SandboxUnavailable`, which the rollout turns into the `sandbox_unavailable` stop reason.
A session call is never retried once sent: a 500/502/504 or a dropped connection raises
`SandboxUnavailable` at once (the code may have run; running it again would corrupt the
session's state); a one-shot call may be replayed. Only evidence the code cannot
forge makes a call an infrastructure failure: the service refuses the connection, says it is
busy, or fails itself — whatever the code does (even to the agent's control socket) comes back
in the ExecResult.

HTTP is aiohttp, as in the engine client: a rollout keeps hundreds of tool calls in flight, and
httpx's connection pool scans every connection per request (40 % of the trainer process's CPU in
`bench/async_speedup.py`'s profile, py-spy). One session per event loop.
"""

from __future__ import annotations

import asyncio
import logging
import random
from typing import Any

import aiohttp

from sandbox.base import ExecResult, SandboxUnavailable

log = logging.getLogger(__name__)

_NOT_RUN = {429, 503}  # the service says the code did not run: safe to retry
_FAILED = {500, 502, 504}  # the service (or a proxy) failed: the code may have run
# HTTP timeout beyond the code's own: the service's queue wait (max_queue_wait_s, then 503) and
# the worker's start; a read timeout is a failure after sending, never retried
_CALL_MARGIN_S = 45.0


class ServiceSandbox:
    def __init__(
        self,
        url: str,
        *,
        token: str | None = None,
        retries: int = 5,
        backoff_s: float = 0.25,
        backoff_max_s: float = 4.0,
        max_concurrency: int = 256,
        owner: object | None = None,
    ) -> None:
        self.url = url.rstrip("/")
        self.retries = retries
        self.backoff_s = backoff_s
        self.backoff_max_s = backoff_max_s
        self._headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._max_concurrency = max_concurrency
        self._http: aiohttp.ClientSession | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._sem = asyncio.Semaphore(max_concurrency)
        self._owner = owner  # e.g. a LocalService started for us; stopped in aclose()

    def _client(self) -> aiohttp.ClientSession:
        loop = asyncio.get_running_loop()
        if self._http is None or self._loop is not loop:
            # idle connections close after 2 s, well before the service's keep-alive (30 s), so
            # a call never lands on a socket the service is closing
            self._http = aiohttp.ClientSession(
                headers=self._headers,
                connector=aiohttp.TCPConnector(
                    limit=self._max_concurrency, limit_per_host=0, keepalive_timeout=2.0
                ),
            )
            self._loop = loop
        return self._http

    async def run(
        self,
        code: str,
        language: str = "python",
        timeout: float = 10.0,
        session: str | None = None,
    ) -> ExecResult:
        body = {"code": code, "language": language, "timeout": timeout, "session": session}
        async with self._sem:
            _, text = await self._post(
                "/v1/run", body, timeout + _CALL_MARGIN_S, replay=session is None
            )
        return ExecResult.model_validate_json(text)

    async def close_session(self, session: str) -> None:
        try:
            await self._post("/v1/sessions/close", {"session": session}, 30.0, replay=True)
        except SandboxUnavailable as e:  # the service reaps it when its lease expires
            log.warning("could not close sandbox session %s: %s", session, e)

    async def health(self) -> dict:
        timeout = aiohttp.ClientTimeout(total=10.0)
        async with self._client().get(f"{self.url}/health", timeout=timeout) as resp:
            resp.raise_for_status()
            return await resp.json()

    async def aclose(self) -> None:
        if self._http is not None and self._loop is asyncio.get_running_loop():
            await self._http.close()
        self._http = None
        stop = getattr(self._owner, "stop", None)
        if stop is not None:
            await asyncio.to_thread(stop)

    async def _post(
        self, path: str, body: dict | None, timeout: float, *, replay: bool
    ) -> tuple[int, str]:
        """POST with retries; returns (status, body text). `replay`: the call may run twice
        (one-shot calls, closing), so it is also retried after it was sent (a dropped
        connection, a 5xx)."""
        last = ""
        limit = aiohttp.ClientTimeout(total=timeout, sock_connect=10.0)
        for attempt in range(self.retries + 1):
            wait = None
            try:
                async with self._client().post(
                    f"{self.url}{path}", json=body, timeout=limit
                ) as resp:
                    status, text = resp.status, await resp.text()
                    retry_after = _retry_after(resp.headers)
            except (aiohttp.ClientConnectorError, aiohttp.ConnectionTimeoutError) as e:
                last = f"{type(e).__name__}: {e}"  # never sent: retry
            except (aiohttp.ClientError, TimeoutError) as e:  # sent, maybe ran
                last = f"{type(e).__name__} after the call was sent: {e}"
                if not replay:
                    break
            else:
                if status < 400:
                    return status, text
                if status in _FAILED:
                    last = f"HTTP {status} after the call was sent: {text[:200]}"
                    if not replay:
                        break
                elif status not in _NOT_RUN:
                    raise ValueError(
                        f"sandbox service at {self.url} rejected the call ({status}): {text[:500]}"
                    )
                last = f"HTTP {status}: {text[:200]}"
                wait = retry_after
            if attempt < self.retries:
                await asyncio.sleep(max(wait or 0.0, self._backoff(attempt)))
        raise SandboxUnavailable(
            f"sandbox service at {self.url} unavailable after {attempt + 1} attempt(s): {last}. "
            "Is `python -m sandbox.server` running and reachable, and is it overloaded "
            "(see /health)?"
        )

    def _backoff(self, attempt: int) -> float:
        cap = min(self.backoff_max_s, self.backoff_s * 2**attempt)
        return random.uniform(cap / 2, cap)


def _retry_after(headers: Any) -> float | None:
    try:
        return min(float(headers["Retry-After"]), 30.0)
    except (KeyError, ValueError):
        return None
