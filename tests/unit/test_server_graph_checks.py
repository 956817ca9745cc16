"""agentrl.engine.checks: a server the user started that runs more requests at once than its
decode CUDA graph holds is warned of, read from /server_info as SGLang 0.5.17 writes it (the
shapes below are its `dataclasses.asdict(ServerArgs)` fields and scheduler info; the real
server's are checked in tests/gpu/test_sglang_auth.py); and a missing httptools is warned of
before agentrl starts SGLang."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

from agentrl.engine import EngineClient
from agentrl.engine.checks import decode_graph_batch, max_running, uncaptured, warn_uncaptured

GRAPH_256 = {"decode": {"backend": "full", "max_bs": 256, "bs": [1, 2, 4, 8, 16, 160, 256]},
             "prefill": {"backend": "disabled", "max_bs": None, "bs": None}}  # fmt: skip


def sglang_info(running: int, graph: dict | None = GRAPH_256, **more) -> dict:
    return {"cuda_graph_config": graph, "max_running_requests": None, "disable_cuda_graph": False,
            "internal_states": [{"max_running_requests": running}], **more}  # fmt: skip


def test_the_decode_graphs_batch_and_the_running_cap_are_read_as_sglang_writes_them():
    assert decode_graph_batch(sglang_info(4096)) == 256
    assert max_running(sglang_info(4096)) == 4096
    assert max_running({"max_running_requests": 256, "internal_states": []}) == 256
    only_max = {"decode": {"backend": "full", "max_bs": 160, "bs": None}}
    assert decode_graph_batch(sglang_info(4096, only_max)) == 160
    # graphs off, by the phase's backend or the legacy flag: nothing to compare
    off = {"decode": {"backend": "disabled", "max_bs": 256, "bs": [256]}}
    assert decode_graph_batch(sglang_info(4096, off)) is None
    assert decode_graph_batch(sglang_info(4096, disable_cuda_graph=True)) is None
    # an older server's flat fields
    assert decode_graph_batch({"cuda_graph_max_bs": 160}) == 160
    assert decode_graph_batch({"cuda_graph_bs": [8, 32]}) == 32
    assert decode_graph_batch({}) is None and max_running({}) is None


def test_a_server_running_past_its_graph_is_warned_of_when_the_episodes_could_fill_it():
    urls = ["http://a", "http://b"]
    stock, capped = sglang_info(4096), sglang_info(256)
    warned = uncaptured(urls, [stock, capped], in_flight=1024)  # 512 a server
    assert len(warned) == 1 and "http://a" in warned[0]
    assert "--max-running-requests 256" in warned[0] and "4096" in warned[0]
    # 256 episodes over two servers never fill a graph of 256: no warning
    assert uncaptured(urls, [stock, stock], in_flight=256) == []
    assert uncaptured(urls, [stock, stock], in_flight=514) != []  # 257 on one
    assert uncaptured(urls[:1], [sglang_info(4096, None)], in_flight=4096) == []  # not told


def test_the_dev_server_is_never_warned_of(devserver, caplog):
    """The real dev server says its running cap and has no CUDA graphs."""

    async def run() -> list[str]:
        async with EngineClient([devserver]) as engine:
            return await warn_uncaptured(engine, in_flight=100_000)

    with caplog.at_level(logging.WARNING, logger="agentrl.engine.checks"):
        assert asyncio.run(run()) == []
    assert not caplog.records


def test_a_missing_http_parser_is_warned_before_sglang_starts(monkeypatch, caplog):
    """SGLang's uvicorn falls back to h11 without httptools (measured slower on every turn):
    agentrl says so before it starts local servers, and is quiet where httptools is there."""
    import importlib.util

    from agentrl.engine import checks

    real = importlib.util.find_spec
    caplog.set_level(logging.WARNING, logger="agentrl.engine.checks")
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "httptools" else real(name, *a))  # fmt: skip
    assert checks.warn_http_parser() is True
    assert "pip install httptools" in caplog.text
    caplog.clear()
    heads = []
    monkeypatch.setattr(checks, "check_head_loads", heads.append)
    checks.before_launch(Path("/nowhere"), "ray")  # servers on Ray nodes: another Python
    assert caplog.text == "" and heads == [Path("/nowhere")]
    checks.before_launch(Path("/nowhere"), "local")
    assert "h11" in caplog.text
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: object())
    assert checks.warn_http_parser() is False
