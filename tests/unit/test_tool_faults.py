"""Tools written by users: a plain `def __call__` runs in a thread; an async one that blocks the
event loop past its timeout, or raises, is the tool's fault (`rollout/tool_exceptions`), logged
once with its traceback, never the model's (`rollout/tool_errors`, the `tool_error` stop)."""

from __future__ import annotations

import asyncio
import logging
import threading
import time

from pydantic import BaseModel

from agentrl import Message, Task, Tool, ToolContext, ToolEnv, ToolResult
from agentrl.env import AssistantTurn
from agentrl.types import ToolCall


class Args(BaseModel):
    x: int = 0


class SyncTool(Tool):
    name, description, Args = "sync", "a blocking tool", Args

    def __call__(self, args, ctx):  # not async: runs in a worker thread
        time.sleep(0.2)
        return ToolResult(content=threading.current_thread().name)


class Sleeper(Tool):
    name, description, Args = "sleeper", "blocks the loop", Args
    timeout_s = 0.2

    async def __call__(self, args, ctx):
        time.sleep(0.5)  # the bug: blocking inside async def
        return ToolResult(content="late")


class Broken(Tool):
    name, description, Args = "broken", "raises", Args

    async def __call__(self, args, ctx):
        raise KeyError("the tool's own bug")


def test_a_plain_def_call_runs_in_a_thread_without_blocking_the_loop():
    async def go():
        t0 = time.monotonic()
        results = await asyncio.gather(*(SyncTool().invoke({}, ToolContext()) for _ in range(4)))
        return results, time.monotonic() - t0

    results, took = asyncio.run(go())
    assert all(not r.is_error and r.content != "MainThread" for r in results)
    assert took < 0.2 * 4  # concurrently, not one after the other (4 x 0.2 s)


def test_a_blocking_async_tool_is_the_tools_fault_and_logged_once(caplog):
    caplog.set_level(logging.ERROR, logger="agentrl.tool")
    for _ in range(2):
        res = asyncio.run(Sleeper().invoke({}, ToolContext()))
        assert res.is_error and res.is_tool_fault and res.metadata["error"] == "blocked_event_loop"
        assert "timed out after 0.2s" in res.content
    logged = [r for r in caplog.records if "Sleeper blocked the event loop" in r.getMessage()]
    assert len(logged) == 1 and "asyncio.to_thread" in logged[0].getMessage()


def test_a_raising_tool_is_logged_once_with_its_traceback(caplog):
    caplog.set_level(logging.ERROR, logger="agentrl.tool")
    for _ in range(3):
        res = asyncio.run(Broken().invoke({}, ToolContext()))
        assert res.is_tool_fault and "KeyError" in res.content
    logged = [r for r in caplog.records if "Broken raised" in r.getMessage()]
    assert len(logged) == 1 and logged[0].exc_info is not None


class Env(ToolEnv):
    tools = [Broken(), SyncTool()]
    max_tool_errors = 2


def test_tool_exceptions_are_counted_apart_and_never_stop_the_episode_as_tool_error():
    env = Env(Task(id="t", data={"prompt": "hi"}))

    async def turns():
        out = []
        for i in range(3):
            calls = [ToolCall(id=f"c{i}", name="broken", arguments={})]
            msg = Message(role="assistant", content="", tool_calls=calls)
            out.append(await env.step(AssistantTurn(message=msg, text="", index=i)))
        bad = [ToolCall(id="x", name="sync", arguments={"x": "not an int"})]
        msg = Message(role="assistant", content="", tool_calls=bad)
        out.append(await env.step(AssistantTurn(message=msg, text="", index=3)))
        return out

    results = asyncio.run(turns())
    assert [(r.tool_exceptions, r.tool_errors, r.done) for r in results[:3]] == [(1, 0, False)] * 3
    assert (results[3].tool_exceptions, results[3].tool_errors) == (0, 1)  # the model's fault


def test_tool_arguments_refuse_extra_keys_unless_the_tool_allows_them():
    from pydantic import ConfigDict

    class Strict(Tool):
        name, description = "strict", "x"

        class Args(BaseModel):
            a: int

        async def __call__(self, args, ctx):
            return ToolResult(content=str(args.a))

    class Loose(Strict):
        name = "loose"

        class Args(BaseModel):
            model_config = ConfigDict(extra="allow")
            a: int

    bad = asyncio.run(Strict().invoke({"a": 1, "verbose": True}, ToolContext()))
    assert bad.is_error and not bad.is_tool_fault and "verbose: unknown argument" in bad.content
    assert "additionalProperties" not in Strict().schema()["function"]["parameters"]  # as shown
    assert not asyncio.run(Loose().invoke({"a": 1, "verbose": True}, ToolContext())).is_error


class Collected(Tool):
    """Its step happens to run when the interpreter collects a large heap (someone else's
    garbage): not the tool's blocking."""

    name, description, Args = "collected", "allocates a little", Args
    timeout_s = 0.2
    heap: list = []

    async def __call__(self, args, ctx):
        import gc

        t0 = time.perf_counter()
        gc.collect()
        Collected.took = time.perf_counter() - t0
        return ToolResult(content="ok")


def test_a_garbage_collection_is_not_the_tools_blocking(caplog):
    caplog.set_level(logging.WARNING, logger="agentrl.tool")
    Collected.heap = [[i] for i in range(3_000_000)]  # a collection takes a while
    try:
        res = asyncio.run(Collected().invoke({}, ToolContext()))
    finally:
        Collected.heap = []
    assert Collected.took > 0.2, "the heap was too small to test anything"
    assert not res.is_error, res
    assert not [r for r in caplog.records if "blocked the event loop" in r.getMessage()]
