"""Two dev servers behind SGLang's real model gateway (smg), started by `agentrl.engine.fleet` as a run
does: every episode's turns go to one server (consistent hashing of its routing key), the episodes
spread over both, admin calls reach both, and a server killed mid-rollout costs no episode (the
router re-sends its requests to the survivor)."""

import asyncio
import os
import signal
from pathlib import Path

import httpx
import pytest
from transformers import AutoTokenizer

from agentrl.engine import EngineClient, EngineConfig, launch_engines, launch_router
from agentrl.envs.code_exec import CodeExecEnv
from agentrl.rollout import Rollout, RolloutConfig
from agentrl.types import StopReason

pytest.importorskip("smg")

TINY = Path(__file__).resolve().parents[2] / "agentrl" / "assets" / "tiny"
CFG = EngineConfig(num_servers=2, router="smg", max_retries=2, backoff_s=0.2)
AUTH = {"Authorization": f"Bearer {CFG.token()}"}  # the servers a run starts want its token


def routing_keys(url: str) -> dict[str, int]:
    info = httpx.get(url + "/server_info", timeout=5, headers=AUTH).json()
    return info["internal_states"][0]["routing_keys"]


def server_pids(urls: list[str]) -> dict[str, int]:
    """The dev server process listening on each URL's port (from /proc)."""
    out = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"agentrl.engine.dev" in cmd:
            port = cmd[cmd.index(b"--port") + 1].decode()
            for u in urls:
                if u.endswith(":" + port):
                    out[u] = int(pid)
    return out


def rollout(urls, router, tasks, kill_after: str | None = None):
    tok = AutoTokenizer.from_pretrained(TINY)
    cfg = RolloutConfig(group_size=8, max_new_tokens=64, max_turns=3)

    async def go():
        async with EngineClient.from_config(CFG.model_copy(update={"urls": urls}),
                                            router=router) as engine:  # fmt: skip
            assert engine.router == router
            ro = Rollout(engine, tok, CodeExecEnv, cfg)
            run = asyncio.ensure_future(ro.run(tasks))
            if kill_after is not None:
                before = sum(routing_keys(kill_after).values())
                while sum(routing_keys(kill_after).values()) == before:
                    await asyncio.sleep(0.05)  # it has taken work: kill it mid-rollout
                os.killpg(server_pids(urls)[kill_after], signal.SIGKILL)
            groups = await run
            versions = (
                await engine.control.update_weight_version("7") if kill_after is None else None
            )
            return [t for g in groups for t in g], versions

    return asyncio.run(go())


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    """Two servers and the router, shared by the module's tests (the last one kills a server)."""
    logs = tmp_path_factory.mktemp("router")
    with launch_engines(CFG, TINY, logs) as urls, launch_router(CFG, urls, logs) as router:
        yield urls, router


def test_episodes_are_pinned_per_server_and_spread_over_both(fleet):
    urls, router = fleet
    assert router is not None and router not in urls
    tasks = CodeExecEnv.load_tasks(n=4, seed=5, kinds=["digit_sum", "primes", "fib_mod"])
    before = {u: routing_keys(u) for u in urls}
    trajs, versions = rollout(urls, router, tasks)
    seen = {u: {k: n - before[u].get(k, 0) for k, n in routing_keys(u).items()
                if n > before[u].get(k, 0)} for u in urls}  # fmt: skip
    assert versions and all(
        httpx.get(u + "/get_weight_version", headers=AUTH).json()["weight_version"] == "7"
        for u in urls
    ), "admin calls go to every server, not through the router"
    assert len(trajs) == 32 and all(t.stop_reason is not StopReason.ABORTED for t in trajs)
    a, b = (set(k) for k in seen.values())
    assert a and b, f"the router sent every episode to one server: {seen}"
    assert not a & b, f"an episode's turns went to both servers: {a & b}"
    turns = sum(len(t.turns) for t in trajs)
    assert sum(sum(k.values()) for k in seen.values()) == turns  # each turn once, nothing lost
    assert max(len(t.turns) for t in trajs) >= 2  # multi-turn episodes stayed on their server


def test_a_server_killed_mid_rollout_loses_no_episode(fleet):
    """Last in the module: it kills one of the fleet's servers."""
    urls, router = fleet
    tasks = CodeExecEnv.load_tasks(n=4, seed=6, kinds=["digit_sum", "primes", "fib_mod"])
    before = sum(routing_keys(urls[1]).values())
    trajs, _ = rollout(urls, router, tasks, kill_after=urls[0])
    survivor = sum(routing_keys(urls[1]).values()) - before
    assert len(trajs) == 32
    assert all(t.stop_reason not in (StopReason.ABORTED,) and t.error is None for t in trajs), [
        (t.stop_reason, t.error) for t in trajs if t.error
    ]
    assert survivor > 0
