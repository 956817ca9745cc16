"""The run's engine token (issue 36): where it comes from, that it stays out of dumps, reprs and
command lines, that SGLang gets it from a private --config file, and that the client sends it
with every request. The servers refusing requests without it: tests/e2e/test_engine_auth.py."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest
import yaml
from aiohttp import web
from pydantic import ValidationError

from agentrl.engine import API_KEY_ENV, RUN_TOKEN, EngineClient, EngineConfig, SamplingParams
from agentrl.engine.fleet import server_command, server_env, write_key_file
from agentrl.engine.router import router_command


def test_the_token_comes_from_config_then_environment_then_the_process(monkeypatch) -> None:
    monkeypatch.delenv(API_KEY_ENV, raising=False)
    assert EngineConfig().token() == RUN_TOKEN and not RUN_TOKEN.startswith("-")
    assert len(RUN_TOKEN) > 40  # 32 random bytes
    monkeypatch.setenv(API_KEY_ENV, "from-the-environment")
    assert EngineConfig().token() == "from-the-environment"
    assert EngineConfig(api_key="from-the-config").token() == "from-the-config"


def test_the_token_is_in_no_dump_or_repr_and_no_launch_argument() -> None:
    cfg = EngineConfig(api_key="s3cret-key-of-this-run")
    assert cfg.model_dump()["api_key"] == "<hidden>"  # the tracker's copy of the config
    assert EngineConfig().model_dump()["api_key"] is None  # Hydra's default: a known key
    assert "s3cret" not in repr(cfg) and "s3cret" not in cfg.model_dump_json()
    assert cfg.model_copy(update={"urls": ["http://x:1"]}).token() == "s3cret-key-of-this-run"
    for args in (["--api-key", "k"], ["--admin-api-key=k"], ["--config", "my.yaml"]):
        with pytest.raises(ValidationError, match="engine.api_key"):
            EngineConfig(kind="sglang", extra_args=args)
    with pytest.raises(ValidationError, match="engine.api_key"):
        EngineConfig(router_args=["--control-plane-api-keys", "a:b:admin:k"])
    with pytest.raises(ValidationError, match="not start with '-'"):
        EngineConfig(api_key="-looks-like-an-option")


def test_sglang_reads_both_keys_from_a_file_only_its_user_can_read(tmp_path: Path) -> None:
    cfg = EngineConfig(kind="sglang", api_key="1e5")  # YAML would read it as a float unquoted
    path = write_key_file(tmp_path / "keys.yaml", cfg.token())
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert yaml.safe_load(path.read_text()) == {"api-key": "1e5", "admin-api-key": "1e5"}
    cmd = server_command(cfg, Path("/m"), 30000, path)
    assert cmd[cmd.index("--config") + 1] == str(path) and "1e5" not in cmd
    assert API_KEY_ENV not in server_env(cfg, 0)
    dev = EngineConfig(api_key="dev-server-key")
    assert server_env(dev, 0)[API_KEY_ENV] == "dev-server-key"
    assert not any("dev-server-key" in a for a in server_command(dev, Path("/m"), 30000))


def test_the_router_command_line_carries_no_key(tmp_path: Path) -> None:
    cfg = EngineConfig(api_key="router-key-of-this-run", num_servers=2)
    cmd = router_command(cfg, ["http://127.0.0.1:1", "http://127.0.0.1:2"], 30000, tmp_path)
    assert not any("router-key" in a for a in cmd)
    assert API_KEY_ENV in cmd[cmd.index("-c") + 1]  # the key joins smg's arguments in-process


async def test_the_client_sends_the_token_with_every_request() -> None:
    seen: list[tuple[str, str | None]] = []

    async def handle(request: web.Request) -> web.Response:
        seen.append((request.path, request.headers.get("Authorization")))
        if request.path != "/generate":
            return web.json_response({"success": True})
        ids = (await request.json())["input_ids"]
        meta = {"id": "r", "finish_reason": {"type": "length", "length": 1}, "prompt_tokens": 1,
                "completion_tokens": 1, "weight_version": "0",
                "output_token_logprobs": [[-0.1, 7, None]]}  # fmt: skip
        one = {"output_ids": [7], "meta_info": meta}
        batched = isinstance(ids[0], list)  # coalesced calls: one list of prompts
        return web.json_response([one] * len(ids) if batched else one)

    app = web.Application()
    app.router.add_route("*", "/{path:.*}", handle)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    url = f"http://127.0.0.1:{runner.addresses[0][1]}"
    cfg = EngineConfig(urls=[url], api_key="client-key-1234", batch_window_ms=5)
    try:
        async with EngineClient.from_config(cfg) as engine:
            await engine.generate([1, 2], SamplingParams(max_new_tokens=1))  # coalesced
            await engine.control.health(deep=True)
            await engine.control.pause_generation()
            await engine.control.continue_generation()
            await engine.control.update_weights_from_tensor(["payload"], "1")
            await engine.control.load_lora_adapter("a", "/tmp/a")
            await engine.control.flush_cache()
            await engine.gen.abort(abort_all=True)
    finally:
        await runner.cleanup()
    assert len(seen) == 8
    assert all(auth == "Bearer client-key-1234" for _, auth in seen), seen
