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
"""

from __future__ import annotations

import asyncio
import logging
import random

import httpx

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
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.url = url.rstrip("/")
        self.retries = retries
        self.backoff_s = backoff_s
        self.backoff_max_s = backoff_max_s
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        limits = httpx.Limits(max_connections=max_concurrency, max_keepalive_connections=64)
        self._http = httpx.AsyncClient(
            headers=headers, limits=limits, timeout=30.0, transport=transport
        )
        self._sem = asyncio.Semaphore(max_concurrency)
        self._owner = owner  # e.g. a LocalService started for us; stopped in aclose()

    async def run(
        self,
        code: str,
        language: str = "python",
        timeout: float = 10.0,
        session: str | None = None,
    ) -> ExecResult:
        body = {"code": code, "language": language, "timeout": timeout, "session": session}
        async with self._sem:
            resp = await self._post(
                "/v1/run", body, timeout + _CALL_MARGIN_S, replay=session is None
            )
        return ExecResult.model_validate(resp.json())

    async def close_session(self, session: str) -> None:
        try:
            await self._post("/v1/sessions/close", {"session": session}, 30.0, replay=True)
        except SandboxUnavailable as e:  # the service reaps it when its lease expires
            log.warning("could not close sandbox session %s: %s", session, e)

    async def health(self) -> dict:
        resp = await self._http.get(f"{self.url}/health", timeout=10.0)
        resp.raise_for_status()
        return resp.json()

    async def aclose(self) -> None:
        await self._http.aclose()
        stop = getattr(self._owner, "stop", None)
        if stop is not None:
            await asyncio.to_thread(stop)

    async def _post(
        self, path: str, body: dict | None, timeout: float, *, replay: bool
    ) -> httpx.Response:
        """POST with retries. `replay`: the call may run twice (one-shot calls, closing), so it
        is also retried after it was sent (a dropped connection, a 5xx)."""
        last = ""
        for attempt in range(self.retries + 1):
            wait = None
            try:
                resp = await self._http.post(f"{self.url}{path}", json=body, timeout=timeout)
            except (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout) as e:
                last = f"{type(e).__name__}: {e}"  # never sent: retry
            except httpx.TransportError as e:  # sent, maybe ran
                last = f"{type(e).__name__} after the call was sent: {e}"
                if not replay:
                    break
            else:
                if resp.status_code < 400:
                    return resp
                if resp.status_code in _FAILED:
                    last = f"HTTP {resp.status_code} after the call was sent: {resp.text[:200]}"
                    if not replay:
                        break
                elif resp.status_code not in _NOT_RUN:
                    raise ValueError(
                        f"sandbox service at {self.url} rejected the call "
                        f"({resp.status_code}): {resp.text[:500]}"
                    )
                last = f"HTTP {resp.status_code}: {resp.text[:200]}"
                wait = _retry_after(resp)
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


def _retry_after(resp: httpx.Response) -> float | None:
    try:
        return min(float(resp.headers["Retry-After"]), 30.0)
    except (KeyError, ValueError):
        return None
