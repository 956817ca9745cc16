"""Issue 36: another local user must not steer a run. The dev server and the router (smg) that
`agentrl.engine.fleet` starts, as a run starts them, refuse every request without the run's Bearer
token (401), answer the run's own client, and keep the token off their command lines and their
logs' readers. SGLang's side is tests/gpu/test_sglang_auth.py."""

from __future__ import annotations

import asyncio
import contextlib
import os
import stat
from pathlib import Path

import httpx
import pytest

from agentrl.engine import EngineClient, EngineConfig, SamplingParams, launch_engines, launch_router

TINY = Path(__file__).resolve().parents[2] / "agentrl" / "assets" / "tiny"
CFG = EngineConfig(router="smg", max_retries=0)
PROMPT = [5, 6, 7, 8]

# what the attacker of issue 36 sent: a weight zeroed, generation paused, the server killed
# (memory released, then a generation), a worker of theirs registered in the router
ATTACKS = [
    ("POST", "/update_weights_from_tensor", {"serialized_named_tensors": ["x"]}),
    ("POST", "/update_weights_from_disk", {"model_path": "/tmp"}),
    ("POST", "/init_weights_update_group", {"master_address": "127.0.0.1"}),
    ("POST", "/pause_generation", {"mode": "abort"}),
    ("POST", "/release_memory_occupation", {}),
    ("GET", "/health_generate", None),
    ("POST", "/generate", {"input_ids": PROMPT, "sampling_params": {"max_new_tokens": 1}}),
    ("POST", "/abort_request", {"abort_all": True}),
    ("POST", "/update_weight_version", {"new_version": "forged"}),
    ("POST", "/load_lora_adapter", {"lora_name": "x", "lora_path": "/tmp"}),
    ("POST", "/flush_cache", None),
    ("GET", "/server_info", None),
    ("GET", "/model_info", None),
]


@pytest.fixture(scope="module")
def logs(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("logs")


@pytest.fixture(scope="module")
def urls(logs) -> list[str]:
    with launch_engines(CFG, TINY, logs) as urls:
        yield urls


def refused(url: str, method: str, path: str, body: object, token: str | None) -> int:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return httpx.request(method, url + path, json=body, headers=headers, timeout=10).status_code


def cmdlines() -> list[bytes]:
    out = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        with contextlib.suppress(OSError):  # gone meanwhile
            out.append(Path(f"/proc/{pid}/cmdline").read_bytes())
    return out


def test_the_dev_server_refuses_every_route_but_health_without_the_run_token(urls, logs):
    url, token = urls[0], CFG.token()
    assert httpx.get(url + "/health", timeout=5).status_code == 200  # a liveness probe stays open
    for method, path, body in ATTACKS:
        assert refused(url, method, path, body, None) == 401, path
        assert refused(url, method, path, body, token[:-1] + "x") == 401, path

    async def run() -> tuple[list[str], list[int]]:
        async with EngineClient.from_config(CFG.model_copy(update={"urls": urls})) as engine:
            params = SamplingParams(max_new_tokens=4, temperature=0.0, ignore_eos=True)
            comp = await engine.generate(PROMPT, params)
            await engine.control.pause_generation()  # the run's own admin calls pass
            await engine.control.continue_generation()
            return await engine.control.get_weight_version(), comp.token_ids

    versions, ids = asyncio.run(run())  # nothing of the above landed: not paused, no new version
    assert versions == ["default"] and len(ids) == 4
    assert not any(token.encode() in c for c in cmdlines())  # `ps` shows no token
    assert stat.S_IMODE((logs / "dev-server-0.log").stat().st_mode) == 0o600


def test_the_router_refuses_clients_and_worker_registration_without_the_run_token(urls, tmp_path):
    """smg started with the run's key: /generate, /workers (the control plane that took a forged
    worker in issue 36) want it; the run's client gets through, and smg hands the key on to the
    dev server behind it."""
    pytest.importorskip("smg")
    token = CFG.token()
    with launch_router(CFG, urls, tmp_path) as router:
        fake = {"url": "http://127.0.0.1:9"}
        assert refused(router, "POST", "/workers", fake, None) == 401
        assert refused(router, "POST", "/workers", fake, "wrong-token-of-someone") == 401
        assert refused(router, "GET", "/workers", None, None) == 401
        assert refused(router, "DELETE", "/workers/x", None, None) == 401
        body = {"input_ids": PROMPT, "sampling_params": {"max_new_tokens": 1}}
        assert refused(router, "POST", "/generate", body, None) == 401
        assert refused(router, "POST", "/flush_cache", None, None) == 401
        workers = httpx.get(router + "/workers", headers={"Authorization": f"Bearer {token}"})
        assert [w["url"] for w in workers.json()["workers"]] == urls

        async def run() -> list[int]:
            cfg = CFG.model_copy(update={"urls": urls})
            async with EngineClient.from_config(cfg, router=router) as engine:
                params = SamplingParams(max_new_tokens=3, temperature=0.0, ignore_eos=True)
                return (await engine.generate(PROMPT, params, key="episode-1")).token_ids

        assert len(asyncio.run(run())) == 3
        assert not any(token.encode() in c for c in cmdlines())
        logged = [tmp_path / "router.log", *(tmp_path / "router").rglob("*")]
        assert not any(token in f.read_text() for f in logged if f.is_file())
        assert stat.S_IMODE((tmp_path / "router.log").stat().st_mode) == 0o600
