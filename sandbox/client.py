"""ServiceSandbox: the async client of the local sandbox service (`python -m agentrl.sandbox.server`).

    from agentrl.sandbox import ServiceSandbox
    sb = ServiceSandbox("http://127.0.0.1:8470")
    await sb.run("x = 2", session="traj-17")
    res = await sb.run("print(x * 21)", session="traj-17")   # res.stdout == "42\\n"
    await sb.close_session("traj-17")
    await sb.aclose()

Failure semantics: an unreachable service or a 503 "busy"/"unavailable" answer (the service
says the code did not run) is retried with exponential backoff and jitter (`retries`,
`backoff_s`, `backoff_max_s`; a Retry-After header is honoured); when retries run out `run`
raises `SandboxUnavailable`, which the rollout turns into the `sandbox_unavailable` stop reason.
So it does when the call's budget is spent (its timeout + `call_margin_s`) on time that is not
the code's: a free slot of this client, the service's queue, retries, a restart of the service.
The tools' own deadlines are longer (their `timeout_grace_s`), so the service's load or restart
never reads as the model's timeout.
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
import contextlib
import hashlib
import logging
import random
from typing import Any, Protocol, runtime_checkable

import aiohttp

from agentrl.sandbox.base import ExecResult, SandboxUnavailable, is_grading

log = logging.getLogger(__name__)

_NOT_RUN = {429, 503}  # the service says the code did not run: safe to retry
_FAILED = {500, 502, 504}  # the service (or a proxy) failed: the code may have run
_MAX_KEY = 200  # the service takes keys of up to 256 characters
_MAX_SESSIONS_KEPT = 100_000
# HTTP timeout beyond the code's own: the service's queue wait (max_queue_wait_s, then 503) and
# the worker's start; a read timeout is a failure after sending, never retried
CALL_MARGIN_S = 45.0


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
        max_restarts: int = 3,
        call_margin_s: float = CALL_MARGIN_S,
    ) -> None:
        self.url = url.rstrip("/")
        self.call_margin_s = call_margin_s  # below the sandbox tools' timeout_grace_s
        self.retries = retries
        self.backoff_s = backoff_s
        self.backoff_max_s = backoff_max_s
        self._headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._token = token
        self._max_concurrency = max_concurrency
        self._images: dict[str, str] = {}  # session -> image (use_image)
        self._http: aiohttp.ClientSession | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        # calls in flight, per lane: a grader's one-shot calls (`base.grading`) never wait for
        # the policy's, which can hold all of theirs waiting in the service's queue
        self._sems = {lane: asyncio.Semaphore(max_concurrency) for lane in ("tool", "grader")}
        self._owner = owner  # e.g. a LocalService started for us; stopped in aclose()
        self.max_restarts = max_restarts
        self.restarts = 0
        self._generation = 0  # +1 per restart of the owned service
        self._sessions: dict[str, int] = {}  # session key -> generation its state lives in
        # a session's calls go one at a time, each with its own deadline from when it is sent:
        # the service runs them one at a time anyway, and a turn of many slow calls sent at once
        # ran past the later calls' deadlines, an outage the policy had made (a red-team pass)
        self._session_locks: dict[str, asyncio.Lock] = {}
        self._restarting: asyncio.Task | None = None  # the restart under way (`revive`)
        self._closed = False  # aclose() ran: no new connection (an episode's late close_session)

    def _client(self) -> aiohttp.ClientSession:
        if self._closed:
            raise SandboxUnavailable("the sandbox client is closed (the run is shutting down)")
        loop = asyncio.get_running_loop()
        if self._http is None or self._loop is not loop:
            # idle connections close after 2 s, well before the service's keep-alive (30 s), so
            # a call never lands on a socket the service is closing
            self._http = aiohttp.ClientSession(
                headers=self._headers,
                connector=aiohttp.TCPConnector(
                    limit=2 * self._max_concurrency, limit_per_host=0, keepalive_timeout=2.0
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
        image: str | None = None,
    ) -> ExecResult:
        """Run one call; in `image` when given, else in the image `use_image` bound to the
        session (None: the host-view sandbox). A one-shot call made under `base.grading()` goes
        in the grader's lane, here and on the service."""
        key = session_key(session) if session is not None else None
        image = image or (self._images.get(session) if session is not None else None)
        body = {"code": code, "language": language, "timeout": timeout, "session": key}
        if image is not None:
            body["image"] = image
        lane = "grader" if key is None and is_grading() else "tool"
        if lane == "grader":
            body["lane"] = lane
        one_at_a_time = self._session_locks.setdefault(key, asyncio.Lock()) if key else None
        budget = timeout + self.call_margin_s
        async with one_at_a_time or contextlib.nullcontext():  # the session's own calls first
            try:
                async with asyncio.timeout(budget), self._sems[lane]:
                    status, text = await self._post(
                        "/v1/run", body, budget, replay=session is None, session=key
                    )
            except TimeoutError:  # the outer deadline (a tool's) would have blamed the model
                raise SandboxUnavailable(
                    f"sandbox service at {self.url} did not answer within {budget:g}s (the "
                    f"call's {timeout:g}s + call_margin_s={self.call_margin_s:g}): its queue, "
                    "retries or a restart took the time. Is it overloaded (see /health)?"
                ) from None
        if status == 413:  # the body (the code) is over the service's size limit: the code's
            return ExecResult(
                stderr=f"[sandbox] not run: the code is over the service's size limit ({text})\n",
                exit_code=None,
                limit="code_size",
            )
        return ExecResult.model_validate_json(text)

    def use_image(self, session: str, image: str | None) -> None:
        """Every call of `session` runs in `image` (a name the service was given, ServerConfig.
        images): the env of a task with a root filesystem of its own sets it before the first
        call, and the session's tools need not know."""
        if image is None:
            self._images.pop(session, None)
        else:
            self._images[session] = image

    async def close_session(self, session: str) -> None:
        key = session_key(session)
        self._sessions.pop(key, None)
        self._session_locks.pop(key, None)
        self._images.pop(session, None)
        if self._closed:  # an episode cancelled at shut-down: the service reaps it (its lease)
            return
        try:
            await self._post("/v1/sessions/close", {"session": key}, 30.0, replay=True)
        except SandboxUnavailable as e:  # the service reaps it when its lease expires
            log.warning("could not close sandbox session %s: %s", session, e)

    async def health(self) -> dict:
        timeout = aiohttp.ClientTimeout(total=10.0)
        async with self._client().get(f"{self.url}/health", timeout=timeout) as resp:
            resp.raise_for_status()
            return await resp.json()

    def worker_copy(self) -> ServiceSandbox:
        """A client of the same service for another process (an agent worker): same URL, token
        and limits; it owns nothing (the service stays this client's to stop)."""
        return ServiceSandbox(
            self.url, token=self._token, retries=self.retries, backoff_s=self.backoff_s,
            backoff_max_s=self.backoff_max_s, max_concurrency=self._max_concurrency,
            max_restarts=0, call_margin_s=self.call_margin_s,
        )  # fmt: skip

    async def aclose(self) -> None:
        self._closed = True
        if self._http is not None and self._loop is asyncio.get_running_loop():
            await self._http.close()
        self._http = None
        stop = getattr(self._owner, "stop", None)
        if stop is not None:
            await asyncio.to_thread(stop)

    async def _post(
        self,
        path: str,
        body: dict | None,
        timeout: float,
        *,
        replay: bool,
        session: str | None = None,
    ) -> tuple[int, str]:
        """POST with retries; returns (status, body text). `replay`: the call may run twice
        (one-shot calls, closing), so it is also retried after it was sent (a dropped
        connection, a 5xx). A service this client started that died is restarted here (see
        `revive`); a `session` begun before the restart has lost its state, so its call raises
        SandboxUnavailable instead of running on a new interpreter as if nothing happened."""
        last = ""
        limit = aiohttp.ClientTimeout(total=timeout, sock_connect=10.0)
        for attempt in range(self.retries + 1):
            wait = None
            self._check_alive(session, last)
            try:
                async with self._client().post(
                    f"{self.url}{path}", json=body, timeout=limit
                ) as resp:
                    status, text = resp.status, await resp.text()
                    retry_after = _retry_after(resp.headers)
            except (aiohttp.ClientConnectorError, aiohttp.ConnectionTimeoutError) as e:
                last = f"{type(e).__name__}: {e}"  # never sent: retry
                if await self.revive():
                    continue
            except (aiohttp.ClientError, TimeoutError) as e:  # sent, maybe ran
                last = f"{type(e).__name__} after the call was sent: {e}"
                if not replay:
                    break
            else:
                if status < 400 or status == 413:
                    if session is not None:
                        self._started(session)
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
            "Is `python -m agentrl.sandbox.server` running and reachable, and is it overloaded "
            "(see /health)?"
        )

    def _check_alive(self, session: str | None, last: str) -> None:
        """SandboxUnavailable when `session` began before the service was restarted: its state
        (variables, files) died with the old one."""
        if session is not None and self._sessions.get(session, self._generation) != (
            self._generation
        ):
            raise SandboxUnavailable(
                f"the sandbox service at {self.url} was restarted after it died; session "
                f"{session!r} lost its state ({last or 'restarted'})"
            )

    def _started(self, session: str) -> None:
        """Remember which service generation a session's state lives in."""
        if session not in self._sessions:
            self._sessions[session] = self._generation
            while len(self._sessions) > _MAX_SESSIONS_KEPT:
                self._sessions.pop(next(iter(self._sessions)))

    async def revive(self) -> bool:
        """Restart the service this client started (`owner`) if its process died: True when it
        did. At most `max_restarts` times; past that the death is SandboxUnavailable. A service
        given by URL is never restarted here (its owner runs it).

        The restart is every caller's: it runs in a task of its own, which each caller awaits
        through `asyncio.shield`. Run in the first caller's task, a caller that gave up during
        it (its episode's group dropped, its tool's deadline: a start takes seconds on a busy
        host) left the restart going on in its thread with the new URL never recorded, so every
        later call went to the dead service's port, or started a second service beside it."""
        owner = self._owner
        if not isinstance(owner, Restartable):
            return False
        if self._restarting is None or self._restarting.done():
            if owner.alive():
                return False
            if self.restarts >= self.max_restarts:
                raise SandboxUnavailable(
                    f"the sandbox service this run started died again after {self.restarts} "
                    "restart(s) (sandbox.max_restarts); its log is in the trainer's stderr"
                )
            self._restarting = asyncio.ensure_future(self._restart(owner))
            # read even when every caller gave up, so its failure is never "never retrieved"
            self._restarting.add_done_callback(lambda t: t.cancelled() or t.exception())
        await asyncio.shield(self._restarting)
        return True

    async def _restart(self, owner: Restartable) -> None:
        log.warning("the sandbox service at %s died; restarting it", self.url)
        try:
            url = await asyncio.to_thread(owner.restart)
        except Exception as e:  # an outage, not the code's fault: the episodes say so
            raise SandboxUnavailable(
                f"the sandbox service this run started died and did not start again "
                f"({type(e).__name__}: {e}); its log is in the trainer's stderr"
            ) from e
        self.url = url.rstrip("/")
        self.restarts += 1
        self._generation += 1

    def _backoff(self, attempt: int) -> float:
        cap = min(self.backoff_max_s, self.backoff_s * 2**attempt)
        return random.uniform(cap / 2, cap)


@runtime_checkable
class Restartable(Protocol):
    """A service a client started and may restart (agentrl.sandbox.server.LocalService)."""

    def alive(self) -> bool: ...

    def restart(self) -> str: ...  # the new URL


def session_key(session: str) -> str:
    """The key the service gets: the session as given, or, when it is longer than the service
    accepts (a long task id), a prefix and its sha256, so no task id makes a call fail."""
    if len(session) <= _MAX_KEY:
        return session
    digest = hashlib.sha256(session.encode("utf-8", "surrogatepass")).hexdigest()
    return f"{session[: _MAX_KEY - 66]}#{digest}"


def _retry_after(headers: Any) -> float | None:
    try:
        return min(float(headers["Retry-After"]), 30.0)
    except (KeyError, ValueError):
        return None
