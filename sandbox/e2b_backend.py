"""E2BSandbox: run code in e2b code-interpreter sandboxes (`pip install agentrl[e2b]`).

The API key and endpoints come from the environment as e2b users expect: E2B_API_KEY,
E2B_DOMAIN, and (self-hosted or tests) E2B_API_URL / E2B_SANDBOX_URL. Our own service speaks the
same protocol under /e2b (sandbox/e2b_compat.py), so this backend also runs against a
self-hosted `python -m agentrl.sandbox.server`:

    import os
    os.environ.update(E2B_API_URL="http://127.0.0.1:8470/e2b",
                      E2B_SANDBOX_URL="http://127.0.0.1:8470/e2b", E2B_API_KEY="local")
    sb = E2BSandbox()
    await sb.run("x = 1", session="traj-1")
    print((await sb.run("x + 1", session="traj-1")).result)    # 2
    await sb.aclose()                                             # kills the e2b sandboxes

Each session gets its own e2b sandbox (killed by `close_session`); a grader's one-shot call
(made under `base.grading()`: `sandbox.grader.grade`) gets one of its own, killed after it; other
stateless calls share one sandbox and get a fresh code context each (contexts of one e2b sandbox
share its processes and filesystem: a grader's test there was within reach of every episode's
code, which could kill the harness of its group's other episodes and read their solutions).
Isolation is e2b's (a Firecracker microVM per sandbox, with internet access unless the template
disables it). Unreachable / 5xx / rate-limited calls are retried with backoff, then raise
`SandboxUnavailable`.
"""

from __future__ import annotations

import asyncio
import logging
import random
import re
import time
from typing import Any

import httpx

from agentrl.sandbox.base import ExecResult, SandboxUnavailable, is_grading
from agentrl.sandbox.config import E2BConfig

log = logging.getLogger(__name__)

_LIMIT_RE = re.compile(r"stopped: (\w+) limit")


def _sdk():
    try:
        import e2b
        import e2b_code_interpreter
    except ImportError as e:
        raise ImportError(
            "the e2b backend needs the e2b SDK: pip install 'agentrl[e2b]' (e2b-code-interpreter)"
        ) from e
    return e2b, e2b_code_interpreter


class E2BSandbox:
    def __init__(
        self,
        cfg: E2BConfig | None = None,
        *,
        retries: int = 3,
        backoff_s: float = 0.5,
        backoff_max_s: float = 8.0,
    ) -> None:
        self.cfg = cfg or E2BConfig()
        self.retries, self.backoff_s, self.backoff_max_s = retries, backoff_s, backoff_max_s
        self._e2b, self._ci = _sdk()
        self._boxes: dict[str, Any] = {}  # session key -> AsyncSandbox
        self._locks: dict[str, asyncio.Lock] = {}
        self._shared: Any = None
        self._shared_start: asyncio.Task | None = None  # the shared sandbox's creation
        self._bg: set[asyncio.Task] = set()  # kills of sandboxes whose caller gave up

    def _opts(self) -> dict[str, Any]:
        opts: dict[str, Any] = {"request_timeout": self.cfg.request_timeout_s}
        if self.cfg.api_key:
            opts["api_key"] = self.cfg.api_key
        if self.cfg.domain:
            opts["domain"] = self.cfg.domain
        return opts

    async def _create(self) -> Any:
        kwargs = self._opts()
        if self.cfg.template:
            kwargs["template"] = self.cfg.template
        return await self._retry(
            lambda: self._ci.AsyncSandbox.create(timeout=self.cfg.sandbox_timeout_s, **kwargs),
            "create an e2b sandbox",
        )

    async def run(
        self,
        code: str,
        language: str = "python",
        timeout: float = 10.0,
        session: str | None = None,
    ) -> ExecResult:
        if session is None and is_grading():
            return await self._run_alone(code, language, timeout)
        if session is None or language != "python":
            return await self._run_stateless(code, language, timeout)
        lock = self._locks.setdefault(session, asyncio.Lock())
        async with lock:
            box = self._boxes.get(session)
            if box is None:
                box = self._boxes[session] = await self._create_own()
            try:
                return await self._exec(box, code, timeout, idempotent=False)
            except self._e2b.NotFoundException:  # the sandbox timed out or was killed
                pass
            box = self._boxes[session] = await self._create_own()
            res = await self._exec(box, code, timeout, idempotent=False)
            res.session_reset = True
            res.stderr = "[sandbox] the e2b sandbox had expired; this is a new one.\n" + res.stderr
            return res

    async def _create_own(self) -> Any:
        """A new sandbox for the caller, created in a task of its own: one whose caller gives up
        during the creation (seconds; its episode dropped) is killed once it exists. Cancelled
        with its caller, the creation left a sandbox running (and billed) until its timeout,
        with nobody holding it."""
        start = asyncio.ensure_future(self._create())
        try:
            return await asyncio.shield(start)
        except asyncio.CancelledError:
            task = asyncio.ensure_future(self._kill_when_made(start))
            self._bg.add(task)  # aclose() waits for it
            task.add_done_callback(self._bg.discard)
            raise

    @staticmethod
    async def _kill_when_made(start: asyncio.Future) -> None:
        try:
            box = await start
        except Exception as e:  # noqa: BLE001 - not made: nothing to kill; its caller had gone
            log.debug("an e2b sandbox nobody waited for was not made: %s: %s", type(e).__name__, e)
            return
        await _kill(box)

    async def _shared_box(self) -> Any:
        """The sandbox of stateless calls, created once for all of them in a task of its own
        (a caller that gives up does not cancel it for the others, nor leak it)."""
        if self._shared is None:
            if self._shared_start is None or self._shared_start.done():
                self._shared_start = asyncio.ensure_future(self._create_shared())
                self._shared_start.add_done_callback(lambda t: t.cancelled() or t.exception())
            await asyncio.shield(self._shared_start)
        return self._shared

    async def _create_shared(self) -> None:
        self._shared = await self._create()

    async def _run_alone(self, code: str, language: str, timeout: float) -> ExecResult:
        """A grader's one-shot call, in an e2b sandbox made for it and killed after it (in the
        background, so a caller that gives up leaves none running)."""
        box = await self._create_own()
        try:
            kw = {} if language == "python" else {"language": language}
            return await self._exec(box, code, timeout, idempotent=True, **kw)
        finally:
            task = asyncio.ensure_future(_kill(box))
            self._bg.add(task)  # aclose() waits for it
            task.add_done_callback(self._bg.discard)

    async def _run_stateless(self, code: str, language: str, timeout: float) -> ExecResult:
        box = await self._shared_box()
        if language != "python":
            return await self._exec(box, code, timeout, idempotent=True, language=language)
        ctx = await self._retry(lambda: box.create_code_context(), "create an e2b code context")
        try:
            return await self._exec(box, code, timeout, idempotent=True, context=ctx)
        finally:
            try:
                await box.remove_code_context(ctx)
            except Exception as e:  # a leaked context dies with the sandbox
                log.debug("could not remove e2b context: %s", e)

    async def _exec(self, box: Any, code: str, timeout: float, *, idempotent: bool, **kw: Any):
        t0 = time.monotonic()

        async def call() -> Any:
            return await box.run_code(
                code, timeout=timeout + 1.0, envs={"AGENTRL_TIMEOUT": str(timeout)}, **kw
            )

        try:
            execution = await self._retry(call, "run code in e2b", idempotent=idempotent)
        except self._e2b.TimeoutException:
            return ExecResult(exit_code=None, timed_out=True, limit="wall_time",
                              duration_s=time.monotonic() - t0)  # fmt: skip
        return _to_result(execution, time.monotonic() - t0)

    async def _retry(self, fn, what: str, idempotent: bool = True) -> Any:
        last: Exception | None = None
        for attempt in range(self.retries + 1):
            try:
                return await fn()
            except (self._e2b.TimeoutException, self._e2b.NotFoundException):
                raise
            except (httpx.ConnectError, httpx.ConnectTimeout, ConnectionError) as e:
                last = e
            except (httpx.TransportError, self._e2b.SandboxException) as e:
                last = e
                if not idempotent:
                    break
            if attempt < self.retries:
                cap = min(self.backoff_max_s, self.backoff_s * 2**attempt)
                await asyncio.sleep(random.uniform(cap / 2, cap))
        raise SandboxUnavailable(
            f"e2b: could not {what}: {type(last).__name__}: {last}. Check E2B_API_KEY and, "
            "for a self-hosted service, E2B_API_URL / E2B_SANDBOX_URL."
        ) from last

    async def close_session(self, session: str) -> None:
        box = self._boxes.pop(session, None)
        self._locks.pop(session, None)
        if box is not None:
            await _kill(box)

    async def aclose(self) -> None:
        if self._shared_start is not None:  # the shared one, once created, is killed below
            await asyncio.gather(self._shared_start, return_exceptions=True)
        await asyncio.gather(*self._bg, return_exceptions=True)
        boxes = list(self._boxes.values()) + ([self._shared] if self._shared else [])
        self._boxes.clear()
        self._shared = None
        await asyncio.gather(*(_kill(b) for b in boxes))


async def _kill(box: Any) -> None:
    try:
        await box.kill()
    except Exception as e:  # it expires on its own
        log.warning("could not kill e2b sandbox: %s", e)


def _to_result(execution: Any, duration_s: float) -> ExecResult:
    stdout = "".join(execution.logs.stdout)
    stderr = "".join(execution.logs.stderr)
    err = execution.error
    res = ExecResult(stdout=stdout, stderr=stderr, duration_s=duration_s)
    main = next((r for r in execution.results if getattr(r, "is_main_result", False)), None)
    if main is not None:
        res.result = main.text
    if err is None:
        return res
    res.exit_code = 1
    if err.name == "TimeoutError":
        res.timed_out, res.exit_code, res.limit = True, None, "wall_time"
    elif err.name == "LimitError" and (m := _LIMIT_RE.search(err.value)):
        res.limit = m.group(1)
    elif err.name == "SystemExit":
        res.exit_code = int(err.value) if err.value.lstrip("-").isdigit() else 1
    else:
        res.error_name, res.error_value = err.name, err.value
        res.stderr += err.traceback
    return res
