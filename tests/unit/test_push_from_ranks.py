"""The colocated push leaves from the learner ranks (`TensorSync.Rank.push_bucket`): the rank that
packs a server's TP rank 0 posts that server's `/update_weights_from_tensor` itself, with the
run's token and SGLang's body (one payload per TP rank, gathered from the ranks that packed
them), and a refusal comes back as a message. The packing and the CUDA-IPC handles need GPUs
(tests/gpu/test_colocated.py); here they are strings, against a loopback HTTP server."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import SimpleNamespace
from typing import Any

import pytest

from agentrl.engine import EngineClient
from agentrl.learner.sync.tensor import TensorSync


class Recorder(BaseHTTPRequestHandler):
    seen: list[tuple[str, str, dict]] = []
    refuse = False

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.seen.append((self.path, self.headers["Authorization"], body))
        status = 400 if self.refuse else 200
        out = json.dumps({"success": not self.refuse, "message": "no such parameter"}).encode()
        self.send_response(status)
        self.send_header("Content-Length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)

    def log_message(self, *args: Any) -> None:
        return None


@pytest.fixture
def servers() -> Iterator[list[str]]:
    Recorder.seen, Recorder.refuse = [], False
    started = [ThreadingHTTPServer(("127.0.0.1", 0), Recorder) for _ in range(2)]
    for s in started:
        threading.Thread(target=s.serve_forever, daemon=True).start()
    yield [f"http://127.0.0.1:{s.server_port}" for s in started]
    for s in started:
        s.shutdown()
        s.server_close()


def rank_half(rank: int, world: int) -> TensorSync.Rank:
    """A rank half whose packing is a string per TP rank (`tp<t>-r<rank>`) or per bucket."""
    state = TensorSync.Rank(SimpleNamespace(rank=rank, world_size=world))
    state.bucket = lambda bucket, packers: f"flat-r{rank}"  # type: ignore[method-assign]
    state.tp_bucket = lambda bucket, n, rows: {  # type: ignore[method-assign]
        t: f"tp{t}-r{rank}" for row in rows for t, r in enumerate(row) if r == rank
    }
    return state


def test_each_server_gets_its_request_from_the_rank_that_packs_its_first_tp_rank(
    servers: list[str], monkeypatch
) -> None:
    endpoints = EngineClient(servers, api_key="run-token").endpoints()
    # two servers at TP 2 whose GPUs hold the learner ranks the other way round
    rows = [[0, 1], [1, 0]]
    halves = [rank_half(r, 2) for r in (0, 1)]
    for h in halves:
        h.connect(endpoints, rows)

    def exchange(out: list, mine: dict) -> None:  # the learner's process group, both ranks
        out[:] = [halves[0].tp_bucket(None, 2, rows), halves[1].tp_bucket(None, 2, rows)]

    monkeypatch.setattr("torch.distributed.all_gather_object", exchange)
    for h in halves:
        assert h.push_bucket([], [("x", ["x"])], "7", True) == []
    got = {auth_body[2]["serialized_named_tensors"][0]: auth_body for auth_body in Recorder.seen}
    assert set(got) == {"tp0-r0", "tp0-r1"}
    path, auth, body = got["tp0-r0"]
    assert path == "/update_weights_from_tensor" and auth == "Bearer run-token"
    assert body == {"serialized_named_tensors": ["tp0-r0", "tp1-r1"], "weight_version": "7",
                    "load_format": "direct", "flush_cache": True}  # fmt: skip
    assert got["tp0-r1"][2]["serialized_named_tensors"] == ["tp0-r1", "tp1-r0"]
    for h in halves:
        assert "post" in h.take_times()
        h.close()


def test_full_tensors_go_to_every_tp_rank_and_a_refusal_comes_back_as_words(
    servers: list[str],
) -> None:
    endpoints = EngineClient(servers, api_key="run-token").endpoints()
    rows = [[0, 0], [0, 0]]  # servers started elsewhere: rank 0 packs for both
    first, second = rank_half(0, 2), rank_half(1, 2)
    for h in (first, second):
        h.connect(endpoints, rows)
    assert second.push_bucket([], None, None, False) == []  # packs for no server: posts nothing
    assert Recorder.seen == []
    assert first.push_bucket([], None, None, False) == []
    assert len(Recorder.seen) == 2  # one request each, both from rank 0
    assert all(b["serialized_named_tensors"] == ["flat-r0"] * 2 for _, _, b in Recorder.seen)
    assert [b["load_format"] for _, _, b in Recorder.seen] == ["flattened_bucket"] * 2
    assert all(b["weight_version"] is None and not b["flush_cache"] for _, _, b in Recorder.seen)
    Recorder.refuse = True
    (refused,) = first.push_bucket([], None, "8", True)
    assert "failed on 2/2 servers" in refused and "HTTP 400: no such parameter" in refused
    first.close()
    second.close()
