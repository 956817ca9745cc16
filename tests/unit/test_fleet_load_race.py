"""A local server that exits on SGLang's load race (its weight-load check counted another
process's GPU allocations as weights: `fleet.LOAD_RACE`) is started again on its port, twice at
most; one whose port another process bound first (`fleet.PORT_RACE`) starts on a new port; any other exit during start-up still fails the start with the log's tail. The servers here
are small Python stand-ins: the first starts print SGLang's message and exit, a later one serves
/health."""

from __future__ import annotations

import socket
import sys
from pathlib import Path

import httpx
import pytest

from agentrl.engine import fleet
from agentrl.engine.config import EngineConfig
from agentrl.engine.protocol import EngineUnavailable

SGLANG_SAYS = (
    "ValueError: Loaded weights leave no GPU memory for the KV cache under "
    "--mem-fraction-static=0.2. Raise --mem-fraction-static above 0.303"
)
STAND_IN = """
import sys, http.server
port, starts_file, fail_first, message = int(sys.argv[1]), sys.argv[2], int(sys.argv[3]), sys.argv[4]
with open(starts_file, "a") as f:
    f.write("x")
if len(open(starts_file).read()) <= fail_first:
    print(message, flush=True)
    sys.exit(1)
class Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.end_headers()
    def log_message(self, *a):
        pass
http.server.HTTPServer(("127.0.0.1", port), Health).serve_forever()
"""


def start_fleet(tmp_path: Path, monkeypatch, fail_first: int, message: str) -> fleet.Fleet:
    tmp_path.mkdir(parents=True, exist_ok=True)
    script, starts = tmp_path / "stand_in.py", tmp_path / "starts"
    script.write_text(STAND_IN)

    def command(cfg, model_path, port, key_file=None):
        return [sys.executable, str(script), str(port), str(starts), str(fail_first), message]

    monkeypatch.setattr(fleet, "server_command", command)
    f = fleet.Fleet(EngineConfig(kind="dev", health_timeout_s=20), tmp_path, tmp_path / "logs")
    try:
        f.start()
    except BaseException:
        f.stop()
        raise
    return f


@pytest.mark.parametrize("fail_first", [1, 2])
def test_a_server_that_lost_the_load_race_starts_again(tmp_path, monkeypatch, caplog, fail_first):
    f = start_fleet(tmp_path, monkeypatch, fail_first, SGLANG_SAYS)
    try:
        assert len((tmp_path / "starts").read_text()) == fail_first + 1
        assert f.procs[0].poll() is None  # the last start serves
        assert caplog.text.count("starting it again") == fail_first
        assert f.logs[0].read_text().count(fleet.RESTART_MARK) == fail_first  # one log, appended
    finally:
        f.stop()


def test_three_lost_races_or_another_exit_fail_the_start_with_the_log(tmp_path, monkeypatch):
    with pytest.raises(EngineUnavailable, match="KV cache"):
        start_fleet(tmp_path, monkeypatch, 3, SGLANG_SAYS)
    assert len((tmp_path / "starts").read_text()) == 3  # the first start and two more
    with pytest.raises(EngineUnavailable, match="CUDA out of memory") as e:
        start_fleet(tmp_path / "b", monkeypatch, 1, "torch.OutOfMemoryError: CUDA out of memory")
    assert "exited with code 1 during start-up" in str(e.value)
    assert len((tmp_path / "b" / "starts").read_text()) == 1  # no second start


def test_a_server_whose_port_was_taken_before_it_bound_starts_on_another(tmp_path, monkeypatch):
    """Another process (here: this test; in CI: another xdist worker's server) binds the port the
    fleet picked before the server does. The server's own bind fails; it starts on a new port."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        picks = iter([taken.getsockname()[1]])
        real = fleet.free_port
        monkeypatch.setattr(
            fleet, "free_port", lambda host="127.0.0.1": next(picks, None) or real(host)
        )
        f = start_fleet(tmp_path, monkeypatch, 0, "")
        try:
            assert "Address already in use" in f.logs[0].read_text()  # the stand-in's real bind
            assert f.urls[0] != f"http://127.0.0.1:{taken.getsockname()[1]}"
            assert f.procs[0].poll() is None
            assert httpx.get(f.urls[0] + "/health", timeout=5).status_code == 200
        finally:
            f.stop()
