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

What one episode's code can reach: its own e2b sandbox, and nothing of another episode's.
Every episode that calls the sandbox gets one e2b sandbox, keyed by its session, made on its
first call and killed by `close_session` (`Env.close`, also when its group is dropped) or, at
the latest, by `aclose` (the run's end). Its session calls run in the sandbox's own context (the
REPL state that persists), and its one-shot calls (`session=None` inside `Tool.invoke`, which
says whose call it is: `base.in_episode`; or another language) in a fresh code context each:
no variables carry over, but they share that episode's files and processes. A one-shot call no
episode claims (a reward's own call, an agent calling `sandbox.run` outside a tool) and a
grader's (under `base.grading()`: `sandbox.grader.grade`) run in an e2b sandbox made for the
call and killed after it. A sandbox made for a caller who gave up is killed once made; one being
made for several callers is made once, in a task of its own awaited through `asyncio.shield`.
All one-shot calls once shared one sandbox for the whole run, and code contexts of one e2b
sandbox share its files and processes: one episode's code could read the files another's wrote,
kill its processes, or leave a file for its group's other episodes to read.

Cost (e2b bills each sandbox for the seconds it runs): one sandbox per episode, from its first
call to its close, idle time between turns included (a 2-minute episode: about 2 sandbox-minutes,
whatever its number of calls); a one-shot call no episode claims, and each grader's test, pays a
sandbox's start (one create request to e2b) on top of the call's own seconds. A call that
starts after its episode closed (a task the episode left running) makes a new sandbox for it,
killed by `aclose` or by e2b at `sandbox_timeout_s`.

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

from agentrl.sandbox.base import ExecResult, SandboxUnavailable, current_episode, is_grading
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
        self._boxes: dict[str, Any] = {}  # episode session -> its AsyncSandbox
        self._starts: dict[str, asyncio.Task] = {}  # episode session -> its sandbox being made
        self._locks: dict[str, asyncio.Lock] = {}  # session -> its REPL calls, one at a time
        self._state: dict[str, Any] = {}  # session -> the sandbox its REPL state lives in
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
        episode = session if session is not None else current_episode()
        if episode is None:  # nobody's episode: no sandbox of one to run it in
            return await self._run_alone(code, language, timeout)
        if session is None or language != "python":
            return await self._run_one_shot(episode, code, language, timeout)
        return await self._run_session(session, code, timeout)

    async def _run_session(self, session: str, code: str, timeout: float) -> ExecResult:
        """A REPL call: in the episode's sandbox's own context, one at a time per session."""
        async with self._locks.setdefault(session, asyncio.Lock()):
            box = await self._episode_box(session)
            try:
                res = await self._exec(box, code, timeout, idempotent=False)
            except self._e2b.NotFoundException:  # the sandbox timed out or was killed
                box = await self._renew(session, box)
                res = await self._exec(box, code, timeout, idempotent=False)
            if self._state.setdefault(session, box) is not box:  # its REPL state is gone
                self._state[session] = box
                res.session_reset = True
                res.stderr = (
                    "[sandbox] the e2b sandbox had expired; this is a new one.\n" + res.stderr
                )
            return res

    async def _run_one_shot(
        self, episode: str, code: str, language: str, timeout: float
    ) -> ExecResult:
        """A one-shot call of `episode`, in its sandbox: a fresh code context (python) or the
        language's own run. Idempotent (it has no state to lose): a sandbox found gone was not
        reached, and the call runs again in the episode's new one."""
        box = await self._episode_box(episode)
        try:
            return await self._once(box, code, language, timeout)
        except self._e2b.NotFoundException:
            box = await self._renew(episode, box)
        return await self._once(box, code, language, timeout)

    async def _once(self, box: Any, code: str, language: str, timeout: float) -> ExecResult:
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

    async def _episode_box(self, episode: str) -> Any:
        """The episode's sandbox, made on its first call, once for all its callers: in a task
        of its own awaited through `asyncio.shield`, so a caller that gives up cancels neither
        the others' wait nor the creation (whose sandbox, once made, is the episode's, killed
        by its close; cancelled with its caller, it ran on at e2b, billed, held by nobody)."""
        box = self._boxes.get(episode)
        if box is not None:
            return box
        start = self._starts.get(episode)
        if start is None:
            start = self._starts[episode] = asyncio.ensure_future(self._make(episode))
            start.add_done_callback(lambda t: t.cancelled() or t.exception())
        return await asyncio.shield(start)

    async def _make(self, episode: str) -> Any:
        """Make the episode's sandbox and hold it for the episode, unless the episode closed
        meanwhile (then `close_session` kills it once made)."""
        try:
            box = await self._create()
        finally:
            ours = self._starts.get(episode) is asyncio.current_task()
            if ours:
                del self._starts[episode]
        if ours:
            self._boxes[episode] = box
        return box

    async def _renew(self, episode: str, gone: Any) -> Any:
        """A new sandbox for the episode whose sandbox `gone` expired (or was killed), shared
        with the episode's other callers that found it gone too."""
        if self._boxes.get(episode) is gone:
            del self._boxes[episode]
        elif episode not in self._boxes and episode not in self._starts:
            raise SandboxUnavailable(
                f"e2b: the sandbox of episode {episode!r} is gone and it has none (the episode "
                "was closed during this call, or its new sandbox could not be made)"
            )
        return await self._episode_box(episode)

    async def _create_own(self) -> Any:
        """A new sandbox for the caller, created in a task of its own: one whose caller gives up
        during the creation (seconds; its episode dropped) is killed once it exists. Cancelled
        with its caller, the creation left a sandbox running (and billed) until its timeout,
        with nobody holding it."""
        start = asyncio.ensure_future(self._create())
        try:
            return await asyncio.shield(start)
        except asyncio.CancelledError:
            self._background(self._kill_when_made(start))
            raise

    def _background(self, coro: Any) -> None:
        """Run `coro` (a kill) in a task that `aclose` waits for."""
        task = asyncio.ensure_future(coro)
        self._bg.add(task)
        task.add_done_callback(self._bg.discard)

    @staticmethod
    async def _kill_when_made(start: asyncio.Future) -> None:
        try:
            box = await start
        except Exception as e:  # noqa: BLE001 - not made: nothing to kill; its caller had gone
            log.debug("an e2b sandbox nobody waited for was not made: %s: %s", type(e).__name__, e)
            return
        await _kill(box)

    async def _run_alone(self, code: str, language: str, timeout: float) -> ExecResult:
        """A one-shot call in an e2b sandbox made for it and killed after it (in the
        background, so a caller that gives up leaves none running)."""
        box = await self._create_own()
        try:
            kw = {} if language == "python" else {"language": language}
            return await self._exec(box, code, timeout, idempotent=True, **kw)
        finally:
            self._background(_kill(box))

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
        """The episode is over: its sandbox is killed (one still being made, once made)."""
        start = self._starts.pop(session, None)
        if start is not None:
            self._background(self._kill_when_made(start))
        box = self._boxes.pop(session, None)
        self._locks.pop(session, None)
        self._state.pop(session, None)
        if box is not None:
            await _kill(box)

    async def aclose(self) -> None:
        """Kill every sandbox this backend made (those being made, once made)."""
        await asyncio.gather(*list(self._starts.values()), return_exceptions=True)
        await asyncio.gather(*list(self._bg), return_exceptions=True)
        boxes = list(self._boxes.values())
        self._boxes.clear()
        self._locks.clear()
        self._state.clear()
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
