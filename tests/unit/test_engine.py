"""EngineClient against fake SGLang servers (httpx.MockTransport) and closed loopback ports."""

from __future__ import annotations

import asyncio
import json
import socket
import subprocess
import sys

import httpx
import pytest

from agentrl.engine import (
    EngineClient,
    EngineConfig,
    EngineError,
    EngineRequestError,
    EngineUnavailable,
    PromptTooLong,
    SamplingParams,
    backoff_delay,
    parse_generate_response,
)
from agentrl.types import FinishReason

STOP = 151645


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def sglang_body(out: list[int], rid: str = "r", finish=None, version: str = "7") -> dict:
    finish = finish or {"type": "stop", "matched": out[-1]}
    return {
        "output_ids": out,
        "meta_info": {
            "id": rid,
            "finish_reason": finish,
            "prompt_tokens": 3,
            "completion_tokens": len(out),
            "weight_version": version,
            "output_token_logprobs": [[-0.5 - i, t, None] for i, t in enumerate(out)],
        },
    }


class FakeServers:
    """Several fake SGLang servers behind one transport, keyed by port.

    `script[port]` is a list of actions consumed one per /generate call: "ok", an int HTTP status,
    or an httpx exception class to raise; when empty, "ok". `gate` holds /generate calls open."""

    def __init__(self, ports: list[int], script: dict[int, list] | None = None):
        self.urls = [f"http://127.0.0.1:{p}" for p in ports]
        self.script = {p: list((script or {}).get(p, [])) for p in ports}
        self.calls: list[tuple[int, str, dict]] = []
        self.gate: asyncio.Event | None = None
        self.open_now: dict[int, int] = dict.fromkeys(ports, 0)

    def transport(self) -> httpx.MockTransport:
        return httpx.MockTransport(self.handle)

    def ports_called(self, path: str = "/generate") -> list[int]:
        return [p for p, pa, _ in self.calls if pa == path]

    async def handle(self, request: httpx.Request) -> httpx.Response:
        port, path = request.url.port, request.url.path
        body = json.loads(request.content) if request.content else {}
        self.calls.append((port, path, body))
        if path != "/generate":
            return httpx.Response(200, json={"success": True, "path": path})
        action = self.script[port].pop(0) if self.script[port] else "ok"
        if isinstance(action, type) and issubclass(action, Exception):
            raise action("fake failure", request=request)
        if isinstance(action, int):
            msg = {"error": {"message": f"fake {action}"}}
            return httpx.Response(action, json=msg)
        self.open_now[port] += 1
        try:
            if self.gate is not None:
                await self.gate.wait()
        finally:
            self.open_now[port] -= 1
        return httpx.Response(200, json=sglang_body([11, 12, STOP], body["rid"]))


def client(fake: FakeServers, **kw) -> EngineClient:
    kw.setdefault("backoff_s", 0.001)
    return EngineClient(fake.urls, transport=fake.transport(), **kw)


async def test_generate_sends_sglang_request_and_parses_completion():
    fake = FakeServers([9001])
    async with client(fake) as engine:
        params = SamplingParams(max_new_tokens=5, temperature=0.7, top_k=20, seed=3)
        comp = await engine.generate([1, 2, 3], params)
    _, path, body = fake.calls[0]
    assert path == "/generate" and body["input_ids"] == [1, 2, 3]
    assert body["return_logprob"] is True and isinstance(body["rid"], str)
    sp = body["sampling_params"]
    assert sp["no_stop_trim"] is True and sp["sampling_seed"] == 3
    assert (sp["max_new_tokens"], sp["temperature"], sp["top_k"]) == (5, 0.7, 20)
    assert comp.token_ids == [11, 12, STOP] and comp.logprobs == [-0.5, -1.5, -2.5]
    assert comp.finish_reason is FinishReason.STOP and comp.matched_stop == STOP
    assert comp.weight_version == "7" and comp.prompt_tokens == 3
    assert comp.server == "http://127.0.0.1:9001" and comp.latency_s >= 0


async def test_least_loaded_routing_spreads_concurrent_requests():
    fake = FakeServers([9001, 9002, 9003])
    fake.gate = asyncio.Event()
    async with client(fake) as engine:
        tasks = [asyncio.create_task(engine.generate([1], SamplingParams())) for _ in range(6)]
        while sum(fake.open_now.values()) < 6:
            await asyncio.sleep(0.001)
        assert engine.inflight == dict.fromkeys(fake.urls, 2)
        assert list(fake.open_now.values()) == [2, 2, 2]
        fake.gate.set()
        comps = await asyncio.gather(*tasks)
        assert sorted(c.server for c in comps) == sorted(fake.urls * 2)
        assert engine.inflight == dict.fromkeys(fake.urls, 0)


async def test_sticky_key_keeps_a_trajectory_on_one_server_until_released():
    fake = FakeServers([9001, 9002])
    fake.gate = asyncio.Event()
    async with client(fake) as engine:
        first = await asyncio.wait_for(_one_open(engine, fake, "episode-a"), 1)
        # 9001 is now busy with episode-a's open request; episode-a still goes back to it
        t2 = asyncio.create_task(engine.generate([1], SamplingParams(), key="episode-a"))
        t3 = asyncio.create_task(engine.generate([1], SamplingParams(), key="episode-b"))
        fake.gate.set()
        c1, c2, c3 = await asyncio.gather(first, t2, t3)
        assert c1.server == c2.server == engine.server_for("episode-a")
        assert c3.server != c1.server  # a new key goes to the least-loaded server
        engine.release("episode-a")
        assert engine.server_for("episode-a") is None


async def _one_open(engine: EngineClient, fake: FakeServers, key: str) -> asyncio.Task:
    task = asyncio.create_task(engine.generate([1], SamplingParams(), key=key))
    while sum(fake.open_now.values()) < 1:
        await asyncio.sleep(0.001)
    return task


async def test_connection_error_moves_to_another_server():
    fake = FakeServers([9001, 9002], {9001: [httpx.ConnectError]})
    async with client(fake) as engine:
        comp = await engine.generate([1], SamplingParams(), key="k")
        assert comp.server.endswith(":9002") and engine.server_for("k") == comp.server
        assert fake.ports_called() == [9001, 9002]
        # 9001 is cooling down: the next new key is not sent there
        comp2 = await engine.generate([1], SamplingParams(), key="other")
        assert comp2.server.endswith(":9002")


@pytest.mark.parametrize("failure", [503, 500, httpx.RemoteProtocolError, httpx.ReadError])
async def test_5xx_and_dropped_connections_are_retried(failure):
    fake = FakeServers([9001], {9001: [failure, failure]})
    async with client(fake, max_retries=3) as engine:
        comp = await engine.generate([1], SamplingParams())
    assert comp.token_ids == [11, 12, STOP]
    assert fake.ports_called() == [9001, 9001, 9001]


async def test_retries_run_out_into_engine_unavailable():
    fake = FakeServers([9001], {9001: [503] * 10})
    async with client(fake, max_retries=2) as engine:
        with pytest.raises(EngineUnavailable, match="after 3 attempts"):
            await engine.generate([1], SamplingParams())
    assert len(fake.ports_called()) == 3


async def test_no_server_listening_raises_one_line_engine_unavailable():
    urls = [f"http://127.0.0.1:{closed_port()}" for _ in range(2)]
    async with EngineClient(urls, max_retries=2, backoff_s=0.001) as engine:
        with pytest.raises(EngineUnavailable) as info:
            await engine.generate([1, 2], SamplingParams())
        msg = str(info.value)
        assert "\n" not in msg and all(u in msg for u in urls)
        assert "agentrl.devserver" in msg and "engine.urls" in msg
        with pytest.raises(EngineUnavailable, match="not healthy"):
            await engine.wait_healthy(timeout_s=0.2, poll_s=0.05)


async def test_prompt_too_long_is_not_retried():
    msg = "The input (5000 tokens) is longer than the model's context length (4096 tokens)."

    async def handler(request: httpx.Request) -> httpx.Response:
        calls.append(request.url.port)
        return httpx.Response(400, json={"error": {"message": msg}})

    calls: list[int] = []
    urls = ["http://127.0.0.1:9001", "http://127.0.0.1:9002"]
    transport = httpx.MockTransport(handler)
    async with EngineClient(urls, transport=transport, backoff_s=0.001) as engine:
        with pytest.raises(PromptTooLong, match="context length") as info:
            await engine.generate(list(range(5000)), SamplingParams())
    assert len(calls) == 1 and info.value.status_code == 400


async def test_other_4xx_is_a_request_error_not_retried():
    fake = FakeServers([9001, 9002], {9001: [400], 9002: [400]})
    async with client(fake) as engine:
        with pytest.raises(EngineRequestError) as info:
            await engine.generate([1], SamplingParams())
    assert not isinstance(info.value, PromptTooLong) and len(fake.ports_called()) == 1


def test_stop_token_trimmed_by_a_server_is_restored_from_logprobs():
    body = sglang_body([11, 12, STOP])
    body["output_ids"] = [11, 12]  # a server that trimmed the matched stop token
    comp = parse_generate_response(body, "s")
    assert comp.token_ids == [11, 12, STOP] and len(comp.logprobs) == 3
    length = sglang_body([11, 12], finish={"type": "length", "length": 2})
    assert parse_generate_response(length).finish_reason is FinishReason.LENGTH
    aborted = sglang_body([], finish={"type": "abort", "message": "x"})
    assert parse_generate_response(aborted).token_ids == []


def test_backoff_delay_doubles_and_caps():
    assert [backoff_delay(a, 0.5, 3.0, 1.0) for a in range(5)] == [0.5, 1.0, 2.0, 3.0, 3.0]
    assert backoff_delay(1, 0.5, 3.0, 0.0) == 0.5  # jitter scales into [0.5, 1] of the delay


async def test_init_weights_update_group_gives_each_server_its_rank_offset():
    fake = FakeServers([9001, 9002, 9003])
    async with client(fake) as engine:
        await engine.init_weights_update_group("127.0.0.1", 29500, backend="gloo")
        await engine.update_weights_from_distributed(
            ["w"], ["torch.float32"], [[2, 3]], weight_version="5"
        )
    inits = sorted((p, b) for p, path, b in fake.calls if path == "/init_weights_update_group")
    assert [b["rank_offset"] for _, b in inits] == [1, 2, 3]
    assert {b["world_size"] for _, b in inits} == {4}
    upd = [b for _, path, b in fake.calls if path == "/update_weights_from_distributed"]
    assert len(upd) == 3 and upd[0]["dtypes"] == ["float32"] and upd[0]["weight_version"] == "5"


async def test_admin_failure_names_the_server_and_falls_back_to_old_routes():
    async def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/model_info":
            return httpx.Response(404, json={"detail": "Not Found"})
        if request.url.port == 9002 and request.url.path == "/flush_cache":
            return httpx.Response(400, text="requests are running")
        if request.url.port == 9002 and request.url.path == "/update_weights_from_disk":
            return httpx.Response(400, json={"success": False, "message": "no such dir"})
        return httpx.Response(200, json={"success": True, "weight_version": "3"})

    urls = ["http://127.0.0.1:9001", "http://127.0.0.1:9002"]
    async with EngineClient(urls, transport=httpx.MockTransport(handler)) as engine:
        infos = await engine.model_info()  # an older server: /get_model_info
        assert [i["weight_version"] for i in infos] == ["3", "3"]
        assert await engine.flush_cache() == [True, False]
        with pytest.raises(EngineError, match=r"1/2 servers: http://127.0.0.1:9002.*no such dir"):
            await engine.update_weights_from_disk("/ckpt", weight_version="4")


def test_config_urls_and_sampling_params_validation():
    cfg = EngineConfig(num_servers=2, base_port=31000)
    assert cfg.server_urls() == ["http://127.0.0.1:31000", "http://127.0.0.1:31001"]
    assert EngineClient.from_config(cfg).urls == cfg.server_urls()
    with pytest.raises(ValueError):
        SamplingParams(top_p=0)
    with pytest.raises(ValueError):
        EngineConfig(kind="vllm")
    assert "stop_token_ids" not in SamplingParams().to_sglang()


def test_engine_imports_no_torch_ray_or_sglang():
    code = (
        "import sys, agentrl.engine\n"
        "bad = [m for m in sys.modules if m.split('.')[0] in ('torch', 'ray', 'sglang')]\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
