"""Issue 36 on real SGLang: a server `agentrl.engine.fleet` starts (as a run does) takes the run's
token as --api-key and --admin-api-key from its private --config file, refuses requests without
it (401: its generation, weight, pause, memory and LoRA routes), answers the run's client (normal
and admin routes), and keeps the token off every command line. With smg installed, the router in
front of it too. Its /server_info, read by the run's client, names its decode CUDA graph's batch
and its running cap as `agentrl.engine.checks` reads them (a server the user started that runs
more requests than its graph holds is warned of)."""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import os
import stat
from pathlib import Path

import httpx
import pytest
import torch

from agentrl.engine import EngineClient, EngineConfig, SamplingParams, launch_engines, launch_router
from agentrl.engine.checks import decode_graph_batch, max_running, uncaptured

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]
FLAGS = ["--attention-backend", "triton", "--sampling-backend", "pytorch",
         "--grammar-backend", "none", "--mm-feature-transport", "cpu", "--cuda-graph-max-bs", "8",
         "--max-running-requests", "64", "--mem-fraction-static", "0.2", "--dtype", "bfloat16"]  # fmt: skip
CFG = EngineConfig(kind="sglang", extra_args=FLAGS, health_timeout_s=420, router="smg")
PROMPT = [9707, 11, 1879, 0, 4340, 525, 498]
ATTACKS = [
    ("POST", "/generate", {"input_ids": PROMPT, "sampling_params": {"max_new_tokens": 1}}),
    ("POST", "/update_weights_from_tensor", {"serialized_named_tensors": ["x"]}),
    ("POST", "/update_weights_from_disk", {"model_path": "/tmp"}),
    ("POST", "/pause_generation", {"mode": "abort"}),
    ("POST", "/release_memory_occupation", {}),
    ("POST", "/update_weight_version", {"new_version": "forged"}),
    ("POST", "/abort_request", {"abort_all": True}),
    ("POST", "/load_lora_adapter", {"lora_name": "x", "lora_path": "/tmp"}),
    ("POST", "/flush_cache", None),
    ("GET", "/model_info", None),
]


def status(url: str, method: str, path: str, body: object, token: str | None) -> int:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return httpx.request(method, url + path, json=body, headers=headers, timeout=30).status_code


def token_on_a_command_line(token: str) -> bool:
    for pid in filter(str.isdigit, os.listdir("/proc")):
        with contextlib.suppress(OSError):
            if token.encode() in Path(f"/proc/{pid}/cmdline").read_bytes():
                return True
    return False


def test_sglang_started_by_agentrl_wants_the_run_token(model_dir, tmp_path):
    token = CFG.token()
    with launch_engines(CFG, model_dir, tmp_path) as urls:
        url = urls[0]
        assert status(url, "GET", "/health", None, None) == 200  # open, as liveness probes need
        for method, path, body in ATTACKS:
            assert status(url, method, path, body, None) == 401, path
            assert status(url, method, path, body, "not-the-run-token") == 401, path

        async def run() -> tuple[list[str], list[int], dict]:
            async with EngineClient.from_config(CFG.model_copy(update={"urls": urls})) as engine:
                await engine.control.update_weight_version("1")  # an admin route: the admin key
                params = SamplingParams(max_new_tokens=4, temperature=0.0, ignore_eos=True)
                async with engine.exclusive(pause=True):
                    pass  # /abort_request, /pause_generation, /continue_generation
                comp = await engine.generate(PROMPT, params)
                info = (await engine.control.server_info())[0]
                return await engine.control.get_weight_version(), comp.token_ids, info

        versions, ids, info = asyncio.run(run())
        assert versions == ["1"] and len(ids) == 4
        assert (decode_graph_batch(info), max_running(info)) == (8, 64), (
            info.get("cuda_graph_config"), info.get("max_running_requests"))  # fmt: skip
        assert len(uncaptured([url], [info], in_flight=64)) == 1
        assert uncaptured([url], [info], in_flight=8) == []
        assert not token_on_a_command_line(token)
        keys = tmp_path / ".sglang-server-0.keys.yaml"
        for private in (keys, tmp_path / "sglang-server-0.log"):
            assert stat.S_IMODE(private.stat().st_mode) == 0o600

        if importlib.util.find_spec("smg") is not None:  # the GPU kit may lack it
            with launch_router(CFG, urls, tmp_path) as router:
                assert (
                    status(router, "POST", "/workers", {"url": "http://127.0.0.1:9"}, None) == 401
                )
                assert status(router, "POST", *ATTACKS[0][1:], None) == 401

                async def routed() -> list[int]:
                    cfg = CFG.model_copy(update={"urls": urls})
                    async with EngineClient.from_config(cfg, router=router) as engine:
                        params = SamplingParams(max_new_tokens=3, temperature=0.0, ignore_eos=True)
                        return (await engine.generate(PROMPT, params, key="e")).token_ids

                assert len(asyncio.run(routed())) == 3
    assert not keys.exists()  # the key file goes with the server
