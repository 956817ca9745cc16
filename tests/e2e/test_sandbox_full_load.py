"""An honest full load is never answered busy: on the real service, sessions whose calls run
longer than `max_queue_wait_s` each get a slot when `max_running >= max_sessions`, and the
configuration where they would not (fewer slots than sessions) is refused at the door of a run's
own service (`SandboxConfig`), with the hazard it guards shown on the real service."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from agentrl.sandbox import Limits, SandboxConfig, ServerConfig
from agentrl.sandbox.server import LocalService

SLEEP = "import time; time.sleep(1.5); print('done')"  # honest, and longer than the queue wait
LIMITS = Limits(wall_s=10, max_wall_s=10, memory_mb=256)


def _cfg(max_running: int, max_sessions: int) -> ServerConfig:
    return ServerConfig(
        warm_workers=1,
        max_running=max_running,
        max_sessions=max_sessions,
        max_queue_wait_s=0.3,
        limits=LIMITS,
    )


async def _sleepers(url: str, sessions: list[str]) -> list[httpx.Response]:
    """Each session makes one long call, the later ones once the earlier hold their slots."""
    async with httpx.AsyncClient(timeout=60) as http:
        calls = []
        for i, key in enumerate(sessions):
            body = {"code": SLEEP, "session": key, "timeout": 10}
            calls.append(asyncio.create_task(http.post(f"{url}/v1/run", json=body)))
            while i < len(sessions) - 1:  # the next call comes when this one runs (or waits)
                health = (await http.get(f"{url}/health")).json()
                if health["running"] + health["waiting"] > i:
                    break
                await asyncio.sleep(0.02)
        return list(await asyncio.gather(*calls))


async def test_sessions_at_full_load_each_get_a_slot() -> None:
    cfg = _cfg(max_running=2, max_sessions=2)
    SandboxConfig(server=cfg)  # accepted
    with LocalService(cfg) as svc:
        answers = await _sleepers(svc.url, ["a", "b"])
        assert [r.status_code for r in answers] == [200, 200]
        assert all(r.json()["stdout"] == "done\n" for r in answers)
        async with httpx.AsyncClient(timeout=60) as http:  # the session cap still holds
            over = await http.post(f"{svc.url}/v1/run", json={"code": "1", "session": "c"})
        assert over.status_code == 503 and over.json()["error"] == "busy"


async def test_fewer_slots_than_sessions_is_refused_for_a_run() -> None:
    cfg = _cfg(max_running=1, max_sessions=2)
    with pytest.raises(ValueError, match="max_running=1 is below max_sessions=2"):
        SandboxConfig(server=cfg)
    SandboxConfig(server=cfg, url="http://127.0.0.1:9")  # a service by URL is its owner's
    with LocalService(cfg) as svc:  # what the refusal spares a run: busy under honest load
        answers = await _sleepers(svc.url, ["a", "b"])
    assert [r.status_code for r in answers] == [200, 503]
    assert "max_queue_wait_s" in answers[1].text


def test_the_defaults_answer_a_full_load() -> None:
    cfg = SandboxConfig()
    assert cfg.server.max_running >= cfg.server.max_sessions
    assert cfg.server.full_load_problem() is None


async def test_sessions_holding_every_slot_never_make_a_one_shot_call_busy() -> None:
    """A red-team pass: sessions and one-shot calls shared the slots, so sessions whose calls
    honestly ran long held them all and a one-shot call (the reward grader's) waited past
    `max_queue_wait_s` and was answered busy: a lost reward. One-shot calls have slots of
    their own; here two sessions hold both of theirs while a one-shot call comes."""
    cfg = _cfg(max_running=2, max_sessions=2)
    with LocalService(cfg) as svc:
        async with httpx.AsyncClient(timeout=60) as http:
            sleepers = asyncio.create_task(_sleepers(svc.url, ["a", "b"]))
            while (await http.get(f"{svc.url}/health")).json()["running"] < 2:
                await asyncio.sleep(0.02)
            body = {"code": "print('graded')", "timeout": 10}
            graded = await http.post(f"{svc.url}/v1/run", json=body)
            answers = await sleepers
        assert graded.status_code == 200 and graded.json()["stdout"] == "graded\n", graded.text
        assert [r.status_code for r in answers] == [200, 200]
