"""`python -m agentrl.engine.dev`: the dev server's command line (its arguments, signals and
uvicorn); agentrl/engine/dev/server.py says what the server does."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
from typing import Any

import torch
import uvicorn

from agentrl.engine.config import API_KEY_ENV
from agentrl.engine.dev import server as server_module
from agentrl.engine.dev.server import DevServer, ServerArgs, build_app

log = logging.getLogger("agentrl.engine.dev")


class _Stop(Exception):
    """SIGTERM / SIGINT: leave uvicorn's loop and exit 0."""


def _raise_stop(signum: int, frame: Any) -> None:
    raise _Stop(signal.Signals(signum).name)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m agentrl.engine.dev",
        description=server_module.__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--model", "--model-path", dest="model", required=True, help="HF model dir")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=30000)
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--attn-implementation", default="sdpa", choices=["sdpa", "eager"])
    p.add_argument("--context-length", type=int, default=None, help="default: the model's")
    p.add_argument("--max-running-requests", type=int, default=64)
    p.add_argument("--max-prefill-tokens", type=int, default=8192)
    p.add_argument("--scheduler", default="continuous", choices=["continuous", "dynamic"])
    p.add_argument("--weight-version", default="default")
    p.add_argument("--seed", type=int, default=0, help="sampling seed of unseeded requests")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    p.add_argument(
        "--prefix-cache-mb", type=float, default=256.0, help="KV of past sequences kept; 0: off"
    )
    p.add_argument(
        "--enable-deterministic-inference",
        action="store_true",
        help="each request computed alone, no prefix cache: ids and logprobs that depend only on "
        "the request (and its sampling_seed), never on the others; slower",
    )
    p.add_argument(
        "--enable-return-routed-experts",
        action="store_true",
        help="a request with return_routed_experts gets the experts each position of its prompt "
        "and output (but the last) was routed to, as SGLang answers it (MoE models)",
    )
    p.add_argument("--log-level", default="warning")
    a = p.parse_args(argv)
    logging.basicConfig(level=a.log_level.upper(), format="%(asctime)s %(name)s %(message)s")
    signal.signal(signal.SIGTERM, _raise_stop)
    signal.signal(signal.SIGINT, _raise_stop)
    if a.threads:
        torch.set_num_threads(a.threads)
    fields = {k: v for k, v in vars(a).items() if k in ServerArgs.__dataclass_fields__}
    api_key = os.environ.pop(API_KEY_ENV, None)
    if not api_key:
        log.warning("no $%s: any local user can steer this server (weights, pause, exit)",
                    API_KEY_ENV)  # fmt: skip
    try:
        server = DevServer(ServerArgs(**fields))
        config = uvicorn.Config(
            build_app(server, api_key),
            host=a.host,
            port=a.port,
            log_level=a.log_level,
            access_log=False,
            timeout_graceful_shutdown=3,
        )
        uvicorn.Server(config).run()
    except _Stop as e:
        log.warning("devserver on port %d stopped by %s", a.port, e)
    return 0


if __name__ == "__main__":
    code = main()
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    # nothing is left to write: skip the interpreter's teardown (torch's thread pools), which
    # took 1.0 of the 1.15 s between SIGTERM and the exit, in every run's shutdown
    os._exit(code)
