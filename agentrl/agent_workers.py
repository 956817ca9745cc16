"""Agent workers (`rollout.gateway.agent_workers=N`): AgentEnv agents run in N processes of
their own instead of the rollout's event loop.

An agent framework spends CPU on every request it makes: the `openai` SDK builds and checks
each request from the whole conversation (about 2 ms a turn of a 4-turn chat on this CPU),
LangGraph more. In the rollout's loop that time is spent one request at a time, in the same
thread that runs the gateway and the engine client, and on a GPU whose engine answers in a few
milliseconds it becomes the run's limit (`bench/gateway_overhead.py --agent-workers`). In a
worker, `run(task, client)` runs in that process's own event loop with its own connection pool
to the gateway; the gateway, the capture and the reward stay in the rollout.

What crosses: the env class (by reference: it must be importable, as `env._target_` is), the
task, `env.args`, the episode's gateway URL and key. What comes back: `run`'s return value and
the attributes `run` set on the env (so `reward`, which runs in the rollout on the env it
built, sees them); each must pickle: one that does not is named in a warning, a return value
that does not is the episode's `agent_error`. The sandbox crosses when it can be shared (the
sandbox service: a client of the same service); any other is replaced by an object that says
why on first use. A worker that dies fails its episodes as `aborted` (infrastructure, out of
the baseline) and is started again for the next episode.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import multiprocessing as mp
import pickle
import threading
import traceback
from dataclasses import dataclass, field
from typing import Any

import openai

from agentrl.tool import ToolContext
from agentrl.types import ConfigError, Task

log = logging.getLogger(__name__)

KEPT_OUT = ("task", "ctx", "result")  # env attributes the rollout's own env already has


def openai_client(base_url: str, key: str, timeout_s: float, http: Any = None) -> Any:
    """The client an agent gets: retries off (a refused request is an answer, not a glitch).
    `http`: one connection pool for all episodes (a client of its own builds an SSL context
    and reads the CA bundle: 15 ms an episode, a quarter of the gateway's cost)."""
    return openai.AsyncOpenAI(
        base_url=base_url, api_key=key, max_retries=0, timeout=timeout_s, http_client=http
    )


class AgentRaised(Exception):
    """The agent raised in its worker: `tb` is its traceback, as the worker printed it."""

    def __init__(self, summary: str, tb: str) -> None:
        super().__init__(summary)
        self.tb = tb


class AgentWorkerDied(Exception):
    """The worker process running the episode ended (crash, kill): infrastructure."""


@dataclass
class Job:
    env_cls: type
    task: Task
    env_kwargs: dict[str, Any]
    session: str
    tool_timeout_s: float
    sandbox: Any  # a picklable sandbox, or None (replaced by NoSandbox in the worker)
    sandbox_kind: str  # the run's sandbox's class name; "" when the run has none
    url: str
    key: str
    timeout_s: float


@dataclass
class _Worker:
    proc: Any
    conn: Any
    send_lock: threading.Lock = field(default_factory=threading.Lock)
    pending: dict[int, asyncio.Future] = field(default_factory=dict)
    dead: str | None = None

    def send(self, msg: tuple) -> None:
        with self.send_lock:
            self.conn.send(msg)


class AgentWorkers:
    """N agent processes (spawned at the first episode), episodes given to the least busy."""

    def __init__(self, n: int) -> None:
        if n < 1:
            raise ValueError("AgentWorkers needs n >= 1")
        self.n = n
        self.workers: list[_Worker | None] = [None] * n
        self._jobs = 0
        self._warned: set[str] = set()
        self._starts: dict[int, asyncio.Task] = {}  # worker i's start under way

    async def run(self, job: Job) -> tuple[Any, dict[str, Any]]:
        """`run(task, client)` of `job` in a worker: (its return value, the env attributes it
        set). Raises AgentRaised, AgentWorkerDied, or ConfigError (the env cannot cross)."""
        try:
            payload = pickle.dumps(job)
        except Exception as e:  # noqa: BLE001 - any pickling failure is the same config error
            raise ConfigError(
                f"rollout.gateway.agent_workers: the episode of {job.env_cls.__qualname__} "
                f"cannot be sent to an agent worker ({type(e).__name__}: {e}); the env class must "
                "be importable (module level, not __main__) and env.args plain values, or set "
                "rollout.gateway.agent_workers=0"
            ) from None
        w = await self._pick()
        loop = asyncio.get_running_loop()
        self._jobs += 1
        jid = self._jobs
        fut: asyncio.Future = loop.create_future()
        w.pending[jid] = fut
        try:
            await asyncio.to_thread(w.send, ("run", jid, payload))
            ok, value, state = await fut
        except asyncio.CancelledError:  # the episode's timeout or the rollout's end
            if w.dead is None:
                with contextlib.suppress(OSError, ValueError):
                    w.send(("cancel", jid))
            raise
        finally:
            w.pending.pop(jid, None)
        if not ok:
            kind, text, tb = value
            if kind == "config":
                raise ConfigError(text)
            raise AgentRaised(text, tb)
        for name in state.pop("__unsent__", []):
            if name not in self._warned:
                self._warned.add(name)
                log.warning(
                    "agent worker: %s.%s was set in run() but cannot be pickled; reward() "
                    "will not see it (rollout.gateway.agent_workers)",
                    job.env_cls.__qualname__,
                    name,
                )
        return value, state

    async def _pick(self) -> _Worker:
        """The least busy worker, each missing one started first. A start is every episode's:
        it runs in a task of its own that each caller awaits through `asyncio.shield`. Run in
        the first caller's task, a caller that gave up during it (its episode's timeout, its
        group dropped) left the process started in its thread and never recorded (alive until
        the trainer ended), and the next episode started another."""
        for i, w in enumerate(self.workers):
            if w is None or w.dead is not None or not w.proc.is_alive():
                start = self._starts.get(i)
                if start is None or start.done():
                    if w is not None:
                        log.warning("agent worker %d ended (%s); starting it again", i, w.dead)
                    start = self._starts[i] = asyncio.ensure_future(self._start(i))
                    start.add_done_callback(lambda t: t.cancelled() or t.exception())
                await asyncio.shield(start)
        live = [w for w in self.workers if w is not None]
        return min(live, key=lambda w: len(w.pending))

    async def _start(self, i: int) -> None:
        loop = asyncio.get_running_loop()
        try:
            self.workers[i] = await asyncio.to_thread(self._spawn, i, loop)
        except Exception as e:  # noqa: BLE001 - infrastructure, said as such
            raise AgentWorkerDied(
                f"agent worker {i} could not start: {type(e).__name__}: {e}"
            ) from e

    def _spawn(self, i: int, loop: asyncio.AbstractEventLoop) -> _Worker:
        ctx = mp.get_context("spawn")  # fork would copy the trainer's threads and CUDA state
        mine, theirs = ctx.Pipe()
        proc = ctx.Process(target=_worker_main, args=(theirs,), name=f"agentrl-agent-{i}",
                           daemon=True)  # fmt: skip
        proc.start()
        theirs.close()
        w = _Worker(proc, mine)
        threading.Thread(target=_read, args=(w, loop), name=f"agentrl-agent-{i}-reader",
                         daemon=True).start()  # fmt: skip
        return w

    async def aclose(self) -> None:
        await asyncio.gather(*self._starts.values(), return_exceptions=True)  # theirs to stop
        workers, self.workers = self.workers, [None] * self.n
        for w in workers:
            if w is None:
                continue
            with contextlib.suppress(OSError, ValueError, BrokenPipeError):
                w.send(("stop",))
        for w in workers:
            if w is None:
                continue
            await asyncio.to_thread(w.proc.join, 5)
            if w.proc.is_alive():
                w.proc.kill()
                await asyncio.to_thread(w.proc.join, 5)
            w.conn.close()


def _read(w: _Worker, loop: asyncio.AbstractEventLoop) -> None:
    """The rollout side's reader of one worker: answers resolve their episode's future."""
    while True:
        try:
            msg = w.conn.recv()
        except (EOFError, OSError):
            break
        _, jid, ok, value, state = msg
        fut = w.pending.get(jid)
        if fut is not None:
            loop.call_soon_threadsafe(_resolve, fut, (ok, value, state))
    w.proc.join(1)
    w.dead = f"exit code {w.proc.exitcode}"

    def fail_all() -> None:
        for fut in list(w.pending.values()):
            if not fut.done():
                fut.set_exception(AgentWorkerDied(f"the agent worker process ended ({w.dead})"))

    with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits any more
        loop.call_soon_threadsafe(fail_all)


def _resolve(fut: asyncio.Future, value: Any) -> None:
    if not fut.done():
        fut.set_result(value)


# -- the worker process ---------------------------------------------------------------------


class NoSandbox:
    """Stands for a sandbox that cannot be shared with an agent worker; says so when used."""

    def __init__(self, kind: str) -> None:
        self._kind = kind

    def __getattr__(self, name: str) -> Any:
        raise RuntimeError(
            f"this AgentEnv's run() executes in an agent worker (rollout.gateway.agent_workers) "
            f"and the run's sandbox ({self._kind}) cannot be shared with it; use the sandbox "
            "service (sandbox.backend=service) or rollout.gateway.agent_workers=0"
        )


def _worker_main(conn: Any) -> None:
    logging.basicConfig(level=logging.WARNING)
    asyncio.run(_serve(conn))


async def _serve(conn: Any) -> None:
    loop = asyncio.get_running_loop()
    inbox: asyncio.Queue = asyncio.Queue()

    def read() -> None:
        while True:
            try:
                msg = conn.recv()
            except (EOFError, OSError):
                msg = ("stop",)
            loop.call_soon_threadsafe(inbox.put_nowait, msg)
            if msg[0] == "stop":
                return

    threading.Thread(target=read, daemon=True).start()
    lock = threading.Lock()
    http = openai.DefaultAsyncHttpxClient(verify=False)
    running: dict[int, asyncio.Task] = {}
    # a cancel sent while its run was still being sent (the caller gave up then) can come first
    given_up: set[int] = set()
    sandboxes: dict[str, Any] = {}  # one client of each shared sandbox per worker

    def send(msg: tuple) -> None:
        with lock:
            conn.send(msg)

    while True:
        msg = await inbox.get()
        if msg[0] == "stop":
            break
        if msg[0] == "cancel":
            t = running.get(msg[1])
            if t is not None:
                t.cancel()
            else:
                given_up.add(msg[1])
            continue
        jid = msg[1]
        if jid in given_up:  # its caller is gone: an episode run now would be nobody's
            given_up.discard(jid)
            continue
        t = asyncio.create_task(_episode(jid, msg[2], http, sandboxes, send))
        running[jid] = t
        t.add_done_callback(lambda _t, j=jid: running.pop(j, None))
    for t in list(running.values()):
        t.cancel()
    await asyncio.gather(*running.values(), return_exceptions=True)
    for sb in sandboxes.values():
        try:
            await sb.aclose()
        except Exception as e:  # noqa: BLE001 - the worker is ending: say it, go on closing
            log.warning("agent worker: closing its sandbox client failed: %s: %s",
                        type(e).__name__, e)  # fmt: skip
    await http.aclose()


async def _episode(jid: int, payload: bytes, http: Any, sandboxes: dict, send: Any) -> None:
    try:
        job: Job = pickle.loads(payload)
        if job.sandbox is None:
            sandbox: Any = NoSandbox(job.sandbox_kind) if job.sandbox_kind else None
        else:
            sandbox = sandboxes.setdefault(
                getattr(job.sandbox, "url", job.sandbox_kind), job.sandbox
            )
        ctx = ToolContext(
            session=job.session, sandbox=sandbox, timeout_s=job.tool_timeout_s, task=job.task
        )
        env = job.env_cls(job.task, ctx, **job.env_kwargs)
        client = openai_client(job.url, job.key, job.timeout_s, http)
        result = await env.run(job.task, client)
    except asyncio.CancelledError:
        return
    except ConfigError as e:
        send(("done", jid, False, ("config", str(e), ""), None))
        return
    except Exception as e:  # noqa: BLE001 - the agent's failure is the episode's agent_error
        send(("done", jid, False, ("error", f"{type(e).__name__}: {e}", traceback.format_exc()),
              None))  # fmt: skip
        return
    state, unsent = {}, []
    for name, value in vars(env).items():
        if name in KEPT_OUT:
            continue
        try:
            pickle.dumps(value)
        except Exception:  # noqa: BLE001 - whatever fails to pickle stays here, named
            unsent.append(name)
            continue
        state[name] = value
    state["__unsent__"] = unsent
    try:
        send(("done", jid, True, result, state))
    except Exception as e:  # noqa: BLE001 - the return value did not pickle
        why = f"run() returned a value that cannot leave the agent worker: {type(e).__name__}: {e}"
        send(("done", jid, False, ("error", why, why), None))
