"""The Sandbox contract every code-execution backend implements.

A sandbox runs untrusted code the policy wrote and reports what happened. Backends: the local
isolated service (`python -m agentrl.sandbox.server` + `agentrl.sandbox.client.ServiceSandbox`), e2b
(`agentrl.sandbox.e2b_backend.E2BSandbox`), and `agentrl.sandbox.subproc.SubprocessSandbox` (rlimits only; for
laptops and tests, not isolation). `sandbox.make_sandbox(SandboxConfig(...))` builds any of them.

    import asyncio
    from agentrl.sandbox import ExecResult, Sandbox, SandboxConfig, make_sandbox

    class EchoSandbox:  # a backend of your own: any object with these three methods
        async def run(self, code, language="python", timeout=10.0, session=None):
            return ExecResult(stdout=code)

        async def close_session(self, session): ...

        async def aclose(self): ...

    async def main():
        sb = make_sandbox(SandboxConfig(backend="subprocess"))  # or "service", "e2b"
        res = await sb.run("print(6 * 7)", language="python", timeout=5.0)
        assert res.stdout == "42\\n" and res.exit_code == 0 and res.ok
        await sb.aclose()
        assert isinstance(EchoSandbox(), Sandbox)

    asyncio.run(main())

Sessions keep interpreter state across calls with the same `session` key (one per trajectory);
`close_session` releases one. A backend that cannot be reached raises `SandboxUnavailable`
(after its own retries); everything the code itself does wrong (exceptions, timeouts, limits)
comes back in the ExecResult.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextvars import ContextVar
from typing import Protocol, runtime_checkable

from pydantic import BaseModel, field_validator


def die_with_parent() -> None:
    """`preexec_fn` for services we spawn: the kernel sends SIGTERM when our process dies, so a
    SIGKILLed trainer leaves no server behind (Linux prctl PR_SET_PDEATHSIG; no-op elsewhere).
    The kernel watches the *thread* that spawned the child, not the process: spawn from a thread
    that outlives the service (a pool thread that exits takes the service with it)."""
    import ctypes
    import signal
    import sys

    if sys.platform.startswith("linux"):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # 1 = PR_SET_PDEATHSIG


_GRADING: ContextVar[bool] = ContextVar("agentrl_sandbox_grading", default=False)


@contextlib.contextmanager
def grading() -> Iterator[None]:
    """The sandbox calls made inside (and in the tasks started inside) are a grader's, a
    reward's, not the policy's: the local service's client runs their one-shot calls in a lane
    of their own (its own calls in flight, and its own slots and queue on the service), so the
    policy's own stateless calls, however many, never make a reward wait or answer busy.
    `sandbox.grader.grade` grades so; a reward that calls `sandbox.run` itself can too:

        with grading():
            res = await sandbox.run(test_program, timeout=10.0)

    Backends without lanes (subprocess, e2b, yours) run the calls as any other."""
    token = _GRADING.set(True)
    try:
        yield
    finally:
        _GRADING.reset(token)


def is_grading() -> bool:
    """Whether the current call is made under `grading()`."""
    return _GRADING.get()


_EPISODE: ContextVar[str | None] = ContextVar("agentrl_sandbox_episode", default=None)


@contextlib.contextmanager
def in_episode(session: str) -> Iterator[None]:
    """The sandbox calls made inside (and in the tasks started inside) are the policy's, for
    the episode `session` (its `ToolContext.session`). `Tool.invoke` makes every tool call so.
    A backend whose one-shot calls are not isolated from each other by themselves (e2b: calls
    in one e2b sandbox share its files and processes) runs an episode's one-shot calls in that
    episode's own sandbox, released by `close_session(session)`; code of your own that calls
    `sandbox.run(code)` for an episode outside a tool can say whose call it is:

        with in_episode(ctx.session):
            res = await ctx.sandbox.run(code, timeout=10.0)

    Backends that isolate every call (the local service, subprocess) need not read it."""
    token = _EPISODE.set(session)
    try:
        yield
    finally:
        _EPISODE.reset(token)


def current_episode() -> str | None:
    """The episode whose call this is (`in_episode`), or None when none said so."""
    return _EPISODE.get()


class SandboxUnavailable(RuntimeError):
    """The backend could not be reached or keeps failing (after its own retries)."""


class ExecResult(BaseModel):
    """What one execution did. Output is decoded UTF-8 (invalid bytes and NULs become U+FFFD)."""

    stdout: str = ""
    stderr: str = ""
    exit_code: int | None = 0
    timed_out: bool = False
    # which limit ended the run, if any: "wall_time", "cpu_time", "memory", "output", "processes",
    # "file_size" (a file past the size limit, or the private /tmp full), "control_channel" (the
    # code wrote to the agent's socket: killed), "code_size" (not run: the code is too large).
    # "memory"/"processes" also when the service stopped this sandbox because it held the most
    # of a service-wide cap (then with session_reset). Every one is the code's own outcome.
    limit: str | None = None
    duration_s: float = 0.0
    # seconds the call waited for a slot in the service before it ran: the service's time,
    # never counted against the code's timeout
    queue_s: float = 0.0
    truncated: bool = False
    # REPL extras (sessions): repr of the value of a trailing expression, like a notebook's Out[n]
    result: str | None = None
    # the uncaught exception, if any (its traceback is in stderr)
    error_name: str | None = None
    error_value: str | None = None
    # the session's interpreter was stopped or expired: variables from earlier calls are gone
    session_reset: bool = False

    @field_validator("stdout", "stderr", "result", "error_name", "error_value", mode="after")
    @classmethod
    def _text(cls, v: str | None) -> str | None:
        """Any text the code produces serialises: lone surrogates (`ValueError('\\ud800')`)
        become U+FFFD here rather than failing the response (and being booked as someone
        else's error)."""
        if v is None:
            return v
        try:
            v.encode("utf-8")
            return v
        except UnicodeEncodeError:
            return v.encode("utf-8", "surrogatepass").decode("utf-8", "replace")

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.timed_out and self.limit is None


@runtime_checkable
class Sandbox(Protocol):
    async def run(
        self,
        code: str,
        language: str = "python",
        timeout: float = 10.0,
        session: str | None = None,
    ) -> ExecResult: ...

    async def close_session(self, session: str) -> None: ...

    async def aclose(self) -> None: ...


@runtime_checkable
class Revivable(Protocol):
    """A sandbox client that can restart a service it started (`ServiceSandbox`)."""

    restarts: int  # how many times it has

    async def revive(self) -> bool: ...  # True when it restarted a dead service now
