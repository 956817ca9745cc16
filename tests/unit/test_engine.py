"""EngineClient against fake SGLang servers (real aiohttp servers on loopback, scripted
answers) and closed loopback ports."""

from __future__ import annotations

import asyncio
import json
import socket
import subprocess
import sys
from collections.abc import Awaitable, Callable

import pytest
from aiohttp import web

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


Handler = Callable[[int, web.Request], Awaitable[web.StreamResponse]]


class Servers:
    """Real HTTP servers on 127.0.0.1 (ephemeral ports), all answering through `handler(i,
    request)`, i the server's index. `async with Servers(n, handler) as srv: srv.urls`."""

    def __init__(self, n: int, handler: Handler):
        self.n, self.handler, self.urls = n, handler, []
        self._runners: list[web.AppRunner] = []

    async def __aenter__(self) -> Servers:
        for i in range(self.n):
            app = web.Application()
            app.router.add_route("*", "/{path:.*}", self._route(i))
            runner = web.AppRunner(app, access_log=None)
            await runner.setup()
            site = web.TCPSite(runner, "127.0.0.1", 0)
            await site.start()
            self._runners.append(runner)
            self.urls.append(f"http://127.0.0.1:{runner.addresses[0][1]}")
        return self

    def _route(self, i: int) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
        async def route(request: web.Request) -> web.StreamResponse:
            return await self.handler(i, request)

        return route

    async def __aexit__(self, *exc: object) -> None:
        for r in self._runners:
            await r.cleanup()


class FakeServers(Servers):
    """Fake SGLang servers. `script[i]` is a list of actions consumed one per /generate call on
    server i: "ok", an int HTTP status, "drop" (close the connection without an answer) or
    "garbage" (answer bytes that are not HTTP); when empty, "ok". `gate` holds /generate calls
    open. Admin routes answer {"success": true}."""

    def __init__(self, n: int, script: dict[int, list] | None = None):
        super().__init__(n, self.handle)
        self.script = {i: list((script or {}).get(i, [])) for i in range(n)}
        self.calls: list[tuple[int, str, dict]] = []
        self.gate: asyncio.Event | None = None
        self.open_now: dict[int, int] = dict.fromkeys(range(n), 0)

    def called(self, path: str = "/generate") -> list[int]:
        return [i for i, pa, _ in self.calls if pa == path]

    async def handle(self, i: int, request: web.Request) -> web.StreamResponse:
        raw = await request.read()
        body = json.loads(raw) if raw else {}
        self.calls.append((i, request.path, body))
        if request.path != "/generate":
            return web.json_response({"success": True, "path": request.path})
        action = self.script[i].pop(0) if self.script[i] else "ok"
        if action in ("drop", "garbage"):
            assert request.transport is not None
            if action == "garbage":
                request.transport.write(b"NOT HTTP AT ALL\r\n\r\n")
            request.transport.close()
            return web.Response()  # never reaches the closed socket
        if isinstance(action, int):
            return web.json_response({"error": {"message": f"fake {action}"}}, status=action)
        self.open_now[i] += 1
        try:
            if self.gate is not None:
                await self.gate.wait()
        finally:
            self.open_now[i] -= 1
        return web.json_response(sglang_body([11, 12, STOP], body["rid"]))


def client(urls: list[str], **kw) -> EngineClient:
    kw.setdefault("backoff_s", 0.001)
    return EngineClient(urls, **kw)


async def test_generate_sends_sglang_request_and_parses_completion():
    async with FakeServers(1) as fake, client(fake.urls) as engine:
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
    assert comp.server == fake.urls[0] and comp.latency_s >= 0


async def test_least_loaded_routing_spreads_concurrent_requests():
    async with FakeServers(3) as fake, client(fake.urls) as engine:
        fake.gate = asyncio.Event()
        tasks = [asyncio.create_task(engine.generate([1], SamplingParams())) for _ in range(6)]
        while sum(fake.open_now.values()) < 6:
            await asyncio.sleep(0.001)
        assert engine.gen.inflight == dict.fromkeys(fake.urls, 2)
        assert list(fake.open_now.values()) == [2, 2, 2]
        fake.gate.set()
        comps = await asyncio.gather(*tasks)
        assert sorted(c.server for c in comps) == sorted(fake.urls * 2)
        assert engine.gen.inflight == dict.fromkeys(fake.urls, 0)


async def test_sticky_key_keeps_a_trajectory_on_one_server_until_released():
    async with FakeServers(2) as fake, client(fake.urls) as engine:
        fake.gate = asyncio.Event()
        first = await asyncio.wait_for(_one_open(engine, fake, "episode-a"), 5)
        # server 0 is now busy with episode-a's open request; episode-a still goes back to it
        t2 = asyncio.create_task(engine.generate([1], SamplingParams(), key="episode-a"))
        t3 = asyncio.create_task(engine.generate([1], SamplingParams(), key="episode-b"))
        fake.gate.set()
        c1, c2, c3 = await asyncio.gather(first, t2, t3)
        assert c1.server == c2.server == engine.gen.server_for("episode-a")
        assert c3.server != c1.server  # a new key goes to the least-loaded server
        engine.release("episode-a")
        assert engine.gen.server_for("episode-a") is None


async def _one_open(engine: EngineClient, fake: FakeServers, key: str) -> asyncio.Task:
    task = asyncio.create_task(engine.generate([1], SamplingParams(), key=key))
    while sum(fake.open_now.values()) < 1:
        await asyncio.sleep(0.001)
    return task


async def test_connection_refused_moves_to_another_server():
    async with FakeServers(1) as fake:
        dead = f"http://127.0.0.1:{closed_port()}"
        async with client([dead, *fake.urls]) as engine:
            comp = await engine.generate([1], SamplingParams(), key="k")
            assert comp.server == fake.urls[0] and engine.gen.server_for("k") == comp.server
            # the dead server is cooling down: the next new key is not sent there
            comp2 = await engine.generate([1], SamplingParams(), key="other")
            assert comp2.server == fake.urls[0]
    assert fake.called() == [0, 0]


@pytest.mark.parametrize("failure", [503, 500, "drop", "garbage"])
async def test_5xx_and_dropped_connections_are_retried(failure):
    async with FakeServers(1, {0: [failure] * 2}) as fake, client(fake.urls, max_retries=3) as e:
        comp = await e.generate([1], SamplingParams())
    assert comp.token_ids == [11, 12, STOP]
    assert fake.called() == [0, 0, 0]


async def test_retries_run_out_into_engine_unavailable():
    async with FakeServers(1, {0: [503] * 10}) as fake, client(fake.urls, max_retries=2) as e:
        with pytest.raises(EngineUnavailable, match="after 3 attempts"):
            await e.generate([1], SamplingParams())
    assert len(fake.called()) == 3


async def test_timed_out_request_is_aborted_on_the_server_and_retried():
    async with FakeServers(1) as fake:
        fake.gate = asyncio.Event()  # never set: every /generate hangs
        async with client(fake.urls, max_retries=1, timeout_s=0.3) as engine:
            with pytest.raises(EngineUnavailable, match="timed out"):
                await engine.generate([1], SamplingParams())
            for _ in range(100):
                if len(fake.called("/abort_request")) == 2:
                    break
                await asyncio.sleep(0.01)
        rids = [b["rid"] for _, p, b in fake.calls if p == "/generate"]
        aborted = [b["rid"] for _, p, b in fake.calls if p == "/abort_request"]
        assert len(rids) == 2 and sorted(aborted) == sorted(rids)
        fake.gate.set()


async def test_request_ids_are_unique_within_and_across_clients():
    """A /generate's rid (what /abort_request names) is its client's random prefix and a count:
    no two requests of one client, or of two clients of one server, share one."""
    async with FakeServers(1) as fake, client(fake.urls) as a, client(fake.urls) as b:
        await asyncio.gather(*(e.generate([1], SamplingParams()) for e in (a, b) * 20))
    rids = [body["rid"] for _, path, body in fake.calls if path == "/generate"]
    assert len(rids) == 40 == len(set(rids)) and all(isinstance(r, str) for r in rids)


async def test_no_server_listening_raises_one_line_engine_unavailable():
    urls = [f"http://127.0.0.1:{closed_port()}" for _ in range(2)]
    async with EngineClient(urls, max_retries=2, backoff_s=0.001) as engine:
        with pytest.raises(EngineUnavailable) as info:
            await engine.generate([1, 2], SamplingParams())
        msg = str(info.value)
        assert "\n" not in msg and all(u in msg for u in urls)
        assert "agentrl.engine.dev" in msg and "engine.urls" in msg
        with pytest.raises(EngineUnavailable, match="not healthy"):
            await engine.control.wait_healthy(timeout_s=0.2, poll_s=0.05)


async def test_prompt_too_long_is_not_retried():
    msg = "The input (5000 tokens) is longer than the model's context length (4096 tokens)."

    async def handler(i: int, request: web.Request) -> web.Response:
        calls.append(i)
        return web.json_response({"error": {"message": msg}}, status=400)

    calls: list[int] = []
    async with Servers(2, handler) as srv, client(srv.urls) as engine:
        with pytest.raises(PromptTooLong, match="context length") as info:
            await engine.generate(list(range(5000)), SamplingParams())
    assert len(calls) == 1 and info.value.status_code == 400


async def test_other_4xx_is_a_request_error_not_retried():
    async with FakeServers(2, {0: [400], 1: [400]}) as fake, client(fake.urls) as engine:
        with pytest.raises(EngineRequestError) as info:
            await engine.generate([1], SamplingParams())
    assert not isinstance(info.value, PromptTooLong) and len(fake.called()) == 1


def test_stop_token_trimmed_by_a_server_is_restored_from_logprobs():
    body = sglang_body([11, 12, STOP])
    body["output_ids"] = [11, 12]  # a server that trimmed the matched stop token
    comp = parse_generate_response(body, "s")
    assert comp.token_ids == [11, 12, STOP] and len(comp.logprobs) == 3
    length = sglang_body([11, 12], finish={"type": "length", "length": 2})
    assert parse_generate_response(length).finish_reason is FinishReason.LENGTH
    aborted = sglang_body([], finish={"type": "abort", "message": "x"})
    assert parse_generate_response(aborted).token_ids == []


def test_cached_tokens_are_read_from_meta_info():
    body = sglang_body([11, 12, STOP])
    assert parse_generate_response(body).cached_tokens == 0  # a server that does not report it
    body["meta_info"].update(prompt_tokens=300, cached_tokens=280)
    comp = parse_generate_response(body)
    assert (comp.prompt_tokens, comp.cached_tokens) == (300, 280)


def test_the_router_is_used_when_asked_or_useful(monkeypatch):
    from agentrl.engine import router

    def installed(yes):
        monkeypatch.setattr(
            router.importlib.util, "find_spec", lambda name: object() if yes else None
        )

    installed(True)
    assert not router.router_wanted(EngineConfig(), 1)  # one server needs no router
    assert router.router_wanted(EngineConfig(), 2)
    assert not router.router_wanted(EngineConfig(router="none"), 2)
    assert router.router_wanted(EngineConfig(router="smg"), 1)
    installed(False)
    assert not router.router_wanted(EngineConfig(), 2)  # auto: the client balances instead
    with pytest.raises(EngineUnavailable, match="pip install smg"):
        router.router_wanted(EngineConfig(router="smg"), 2)


def test_backoff_delay_doubles_and_caps():
    assert [backoff_delay(a, 0.5, 3.0, 1.0) for a in range(5)] == [0.5, 1.0, 2.0, 3.0, 3.0]
    assert backoff_delay(1, 0.5, 3.0, 0.0) == 0.5  # jitter scales into [0.5, 1] of the delay


async def test_init_weights_update_group_gives_each_server_its_rank_offset():
    async with FakeServers(3) as fake, client(fake.urls) as engine:
        await engine.control.init_weights_update_group("127.0.0.1", 29500, backend="gloo")
        await engine.control.update_weights_from_distributed(
            ["w"], ["torch.float32"], [[2, 3]], weight_version="5"
        )
    inits = sorted((i, b) for i, path, b in fake.calls if path == "/init_weights_update_group")
    assert [b["rank_offset"] for _, b in inits] == [1, 2, 3]
    assert {b["world_size"] for _, b in inits} == {4}
    upd = [b for _, path, b in fake.calls if path == "/update_weights_from_distributed"]
    assert len(upd) == 3 and upd[0]["dtypes"] == ["float32"] and upd[0]["weight_version"] == "5"


async def test_admin_failure_names_the_server_and_falls_back_to_old_routes():
    async def handler(i: int, request: web.Request) -> web.Response:
        if request.path == "/model_info":
            return web.json_response({"detail": "Not Found"}, status=404)
        if i == 1 and request.path == "/flush_cache":
            return web.Response(status=400, text="requests are running")
        if i == 1 and request.path == "/update_weights_from_disk":
            return web.json_response({"success": False, "message": "no such dir"}, status=400)
        return web.json_response({"success": True, "weight_version": "3"})

    async with Servers(2, handler) as srv, EngineClient(srv.urls) as engine:
        infos = await engine.control.model_info()  # an older server: /get_model_info
        assert [i["weight_version"] for i in infos] == ["3", "3"]
        assert await engine.control.flush_cache() == [True, False]
        bad = srv.urls[1].replace("/", r"\/").replace(".", r"\.")
        with pytest.raises(EngineError, match=rf"1/2 servers: {bad}.*no such dir"):
            await engine.control.update_weights_from_disk("/ckpt", weight_version="4")


async def test_client_survives_a_new_event_loop_and_idle_keepalive():
    """train.py runs one asyncio.run() per step, and steps can be longer than any keep-alive."""
    async with FakeServers(1) as fake:
        engine = client(fake.urls)
        assert (await engine.generate([1], SamplingParams())).token_ids[-1] == STOP
        await asyncio.sleep(2.5)  # past the client's 2 s idle close
        assert (await engine.generate([1], SamplingParams())).token_ids[-1] == STOP
        await engine.aclose()
    assert fake.called() == [0, 0]


def test_config_urls_and_sampling_params_validation():
    cfg = EngineConfig(num_servers=2, base_port=31000)
    assert cfg.server_urls() == ["http://127.0.0.1:31000", "http://127.0.0.1:31001"]
    assert EngineClient.from_config(cfg).urls == cfg.server_urls()
    with pytest.raises(ValueError):
        SamplingParams(top_p=0)
    with pytest.raises(ValueError):
        EngineConfig(kind="vllm")
    assert "stop_token_ids" not in SamplingParams().to_sglang()


def test_sampling_penalties_are_pinned_neutral():
    # SGLang fills unset keys from the model's generation_config.json; a repetition penalty
    # there would make engine and trainer logprobs disagree, so every request pins them.
    sp = SamplingParams().to_sglang()
    assert sp["repetition_penalty"] == 1.0
    assert sp["frequency_penalty"] == 0.0 and sp["presence_penalty"] == 0.0
    assert sp["min_p"] == 0.0 and sp["top_p"] == 1.0 and sp["top_k"] == -1


def test_engine_imports_no_torch_ray_or_sglang():
    code = (
        "import sys, agentrl.engine\n"
        "bad = [m for m in sys.modules if m.split('.')[0] in ('torch', 'ray', 'sglang')]\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


async def test_a_cancelled_generate_is_aborted_on_its_server():
    """Over-sampling drops groups by cancelling their episodes: the engine must stop sampling
    them (SGLang /abort_request with the request's rid), not finish work nobody reads."""
    async with FakeServers(1) as fake, client(fake.urls) as engine:
        fake.gate = asyncio.Event()  # /generate hangs until released
        task = asyncio.ensure_future(engine.generate([1, 2], SamplingParams(), key="ep"))
        while not fake.called():
            await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        for _ in range(100):
            if fake.called("/abort_request"):
                break
            await asyncio.sleep(0.02)
        (gen,) = [b for _, p, b in fake.calls if p == "/generate"]
        (abort,) = [b for _, p, b in fake.calls if p == "/abort_request"]
        assert abort == {"rid": gen["rid"]}
        fake.gate.set()


@pytest.mark.parametrize("args", [["--tokenizer-worker-num", "4"], ["--tokenizer-worker-num=2"]])
def test_extra_tokenizer_workers_are_refused_they_report_stale_weight_versions(args):
    with pytest.raises(ValueError, match="stale weight versions"):
        EngineConfig(kind="sglang", extra_args=["--dtype", "bfloat16", *args])
    EngineConfig(kind="sglang", extra_args=["--tokenizer-worker-num", "1"])


async def test_a_pausing_push_cuts_a_turn_and_it_goes_on_with_each_tokens_version():
    """exclusive(pause=True) on a scripted SGLang: /abort_request (abort_all) returns the running
    call with two tokens (version 1), and one caught before the scheduler with SGLang's 400 "was
    aborted"; then /pause_generation, the push, /continue_generation; both are sent again as
    prompt + what they had, for the tokens left, and each caller gets one completion whose
    segments say which version sampled what."""
    aborted = asyncio.Event()
    seen: list[dict] = []
    admin: list[str] = []

    async def handle(i: int, request: web.Request) -> web.StreamResponse:
        body = await request.json() if request.can_read_body else {}
        if request.path != "/generate":
            admin.append(request.path)
            if request.path == "/abort_request":
                assert body["abort_all"] is True
                aborted.set()
            if request.path == "/pause_generation":
                assert body == {"mode": "abort"}
            return web.json_response({"success": True})
        seen.append(body)
        prompt = body["input_ids"]
        if len(seen) <= 2:  # both run until aborted
            await aborted.wait()
            if prompt[0] == 2:
                msg = f"Request {body['rid']} was aborted"
                return web.json_response({"error": {"message": msg}}, status=400)
            return web.json_response(sglang_body([11, 12], body["rid"], {"type": "abort"}, "1"))
        return web.json_response(sglang_body([13, STOP], body["rid"], version="2"))

    async with Servers(1, handle) as srv, client(srv.urls) as engine:
        params = SamplingParams(max_new_tokens=5)
        calls = [asyncio.create_task(engine.generate(p, params)) for p in ([1, 1], [2, 2])]
        while len(seen) < 2:
            await asyncio.sleep(0.01)
        async with engine.exclusive(pause=True) as inflight:
            assert inflight == 2
            await asyncio.sleep(0.05)
            assert len(seen) == 2  # nothing is sent again before the push is over
            assert admin == ["/abort_request", "/pause_generation"]
        first, second = await asyncio.gather(*calls)
    assert admin == ["/abort_request", "/pause_generation", "/continue_generation"]
    assert first.token_ids == [11, 12, 13, STOP] and first.finish_reason is FinishReason.STOP
    assert first.segments == [(2, "1"), (2, "2")] and first.weight_version == "1"
    assert first.logprobs == [-0.5, -1.5, -0.5, -1.5]
    assert second.token_ids == [13, STOP] and second.segments == [] and second.weight_version == "2"
    again = {tuple(b["input_ids"]): b["sampling_params"]["max_new_tokens"] for b in seen[2:]}
    assert again == {(1, 1, 11, 12): 3, (2, 2): 5}


async def test_without_pause_a_push_waits_for_the_turns_in_flight():
    release = asyncio.Event()

    async def handle(i: int, request: web.Request) -> web.StreamResponse:
        assert request.path == "/generate", request.path  # no pause, no continue
        body = await request.json()
        await release.wait()
        return web.json_response(sglang_body([11, STOP], body["rid"]))

    async with Servers(1, handle) as srv, client(srv.urls) as engine:
        call = asyncio.create_task(engine.generate([1], SamplingParams(max_new_tokens=4)))
        await asyncio.sleep(0.05)
        asyncio.get_running_loop().call_later(0.1, release.set)
        async with engine.exclusive() as inflight:
            assert inflight == 1 and call.done()
        assert (await call).segments == []
