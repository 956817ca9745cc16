"""`python -m agentrl.sandbox.server`: the isolated code-execution service over HTTP (loopback by default).

    python -m agentrl.sandbox.server --port 8470 --warm-workers 8
    curl -s localhost:8470/health                       # isolation measured at start, pool, limits
    curl -s localhost:8470/v1/run -d '{"code": "print(6*7)"}' -H 'content-type: application/json'

Routes: `POST /v1/run` {code, language="python"|"bash", timeout, session, image,
lane="tool"|"grader" (a one-shot call's slots: sandbox/admission.py)} -> ExecResult JSON;
`POST /v1/sessions/{key}/close`; `GET /health`; the e2b protocol under `/e2b`
(sandbox/e2b_compat.py). A full service answers 503 with Retry-After (`{"error": "busy"}`);
clients retry with backoff (sandbox/client.py). If `token` is set, every route but /health wants
`Authorization: Bearer <token>` (or `X-API-KEY`). What the sandbox isolates, and what it does
not, is in sandbox/isolation.py and on /health.

From Python (trainer, tests), `LocalService` starts one on 127.0.0.1 with a free port and
stops it (the whole process tree) on exit:

    with LocalService(ServerConfig(warm_workers=4)) as svc:
        sb = ServiceSandbox(svc.url)
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import select
import signal
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from typing import Any, Literal

import httpx
from fastapi import Depends, FastAPI, Header, HTTPException, Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ConfigDict, Field

import agentrl
from agentrl.sandbox.admission import Busy
from agentrl.sandbox.base import ExecResult, die_with_parent
from agentrl.sandbox.config import ServerConfig
from agentrl.sandbox.e2b_compat import install as install_e2b_routes
from agentrl.sandbox.service import ExecService, until_disconnect
from agentrl.sandbox.worker import WorkerStartError

log = logging.getLogger("agentrl.sandbox.server")
READY_PREFIX = "agentrl-sandbox listening on "


class CloseRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    session: str = Field(min_length=1, max_length=256)


class RunRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    code: str
    language: str = "python"
    timeout: float | None = Field(None, gt=0)
    session: str | None = Field(None, min_length=1, max_length=256)
    image: str | None = Field(None, min_length=1, max_length=128)
    lane: Literal["tool", "grader"] = "tool"  # a one-shot call's slots (sandbox/admission.py)


class BodyLimit:
    """ASGI middleware: refuse a POST whose body is larger than any valid call (code + JSON
    overhead; JSON may escape a byte as \\uXXXX) before reading it; a chunked body is cut off
    at the limit."""

    def __init__(self, app: Any, limit: int) -> None:
        self.app, self.limit = app, limit

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["method"] == "POST":
            size = dict(scope["headers"]).get(b"content-length", b"").decode()
            if size and (not size.isdigit() or int(size) > self.limit):
                detail = f"request body over {self.limit} bytes"
                resp = JSONResponse({"error": "bad_request", "detail": detail}, 413)
                await resp(scope, receive, send)
                return
            if not size:  # chunked: count as it arrives; past the limit the client is "gone"
                receive = self._counted(receive)
        await self.app(scope, receive, send)

    def _counted(self, receive: Any) -> Any:
        seen = 0

        async def counted() -> dict:
            nonlocal seen
            message = await receive()
            seen += len(message.get("body", b""))
            return {"type": "http.disconnect"} if seen > self.limit else message

        return counted


def add_error_answers(app: FastAPI) -> None:
    """The HTTP answer to each error a call can end in: full (503 + Retry-After), no worker
    (503), the client gone (499), a malformed call (400)."""

    @app.exception_handler(Busy)
    async def busy(request: Request, exc: Busy) -> JSONResponse:
        headers = {"Retry-After": str(max(1, round(exc.retry_after)))}
        return JSONResponse({"error": "busy", "detail": str(exc)}, 503, headers)

    @app.exception_handler(WorkerStartError)
    async def no_worker(request: Request, exc: WorkerStartError) -> JSONResponse:
        log.error("%s", exc)
        return JSONResponse({"error": "unavailable", "detail": str(exc)}, 503, {"Retry-After": "1"})

    @app.exception_handler(ConnectionAbortedError)
    async def gone(request: Request, exc: ConnectionAbortedError) -> Response:
        return Response(status_code=499)  # the client left; its call was stopped

    @app.exception_handler(ValueError)
    async def bad(request: Request, exc: ValueError) -> JSONResponse:
        return JSONResponse({"error": "bad_request", "detail": str(exc)}, 400)


def create_app(cfg: ServerConfig, port: int | None = None, on_ready=None) -> FastAPI:
    """The ASGI app. `port` is the bound port (for the start-up isolation probe)."""
    svc = ExecService(cfg, probe_port=port)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await svc.start()
        if on_ready is not None:
            on_ready(svc)
        try:
            yield
        finally:
            await svc.stop()

    def auth(authorization: str | None = Header(None), x_api_key: str | None = Header(None)):
        if cfg.token is None:
            return
        bearer = authorization.removeprefix("Bearer ").strip() if authorization else None
        if cfg.token not in (bearer, x_api_key):
            raise HTTPException(401, "missing or wrong token: send 'Authorization: Bearer <token>'")

    app = FastAPI(title="agentrl sandbox", lifespan=lifespan)
    app.state.service = svc
    add_error_answers(app)

    @app.get("/health")
    async def health() -> dict[str, Any]:
        return svc.health()

    @app.post("/v1/run", dependencies=[Depends(auth)])
    async def run(req: RunRequest, request: Request) -> ExecResult:
        return await until_disconnect(
            request,
            svc.run(req.code, req.language, req.timeout, req.session, req.image, req.lane),
        )

    @app.post("/v1/sessions/close", dependencies=[Depends(auth)])
    async def close_by_body(req: CloseRequest) -> dict[str, bool]:
        """The session key in the body: any string a task id holds (`gsm8k/train-17?x#1%`)."""
        return {"closed": await svc.close_session(req.session)}

    @app.post("/v1/sessions/{key:path}/close", dependencies=[Depends(auth)])
    async def close(key: str) -> dict[str, bool]:
        return {"closed": await svc.close_session(key)}

    app.add_middleware(BodyLimit, limit=cfg.max_code_bytes * 6 + 64 * 1024)

    install_e2b_routes(app, svc, cfg.token, cfg.e2b_timeout_s)
    return app


def serve(cfg: ServerConfig) -> None:
    """Bind (port 0 = any free port), print the URL line once the service is up, serve."""
    import uvicorn

    family = socket.AF_INET6 if ":" in cfg.host else socket.AF_INET
    # proto IPPROTO_TCP (not 0) so asyncio sets TCP_NODELAY on accepted connections; without
    # it every keep-alive response waits ~40 ms for a delayed ACK
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((cfg.host, cfg.port))
    sock.listen(1024)
    port = sock.getsockname()[1]
    host = f"[{cfg.host}]" if ":" in cfg.host else cfg.host

    def ready(svc: ExecService) -> None:
        caps = svc.caps
        log.info("isolation=%s namespaces=%s cgroup=%s seccomp=%s", caps.mode,
                 caps.namespaces, caps.cgroup, caps.seccomp)  # fmt: skip
        print(f"{READY_PREFIX}http://{host}:{port}", flush=True)

    app = create_app(cfg, port=port, on_ready=ready)
    config = uvicorn.Config(app, log_level="warning", access_log=False, timeout_keep_alive=30)
    with contextlib.suppress(KeyboardInterrupt):  # uvicorn re-raises SIGINT after shutting down
        asyncio.run(uvicorn.Server(config).serve(sockets=[sock]))


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(
        prog="python -m agentrl.sandbox.server", description=__doc__.split("\n")[0]
    )
    p.add_argument("--host", default=None)
    p.add_argument("--port", type=int, default=None, help="0 = any free port")
    p.add_argument("--warm-workers", type=int, default=None)
    p.add_argument("--max-running", type=int, default=None)
    p.add_argument("--isolation", choices=["auto", "bwrap", "rlimits"], default=None)
    p.add_argument("--config-json", default=None, help="a ServerConfig as JSON (any local user "
                   "can read a command line: put a token in --config-env's variable instead)")  # fmt: skip
    p.add_argument("--config-env", default=None, metavar="VAR",
                   help="the name of an environment variable holding a ServerConfig as JSON")  # fmt: skip
    args = p.parse_args(argv)
    data = json.loads(args.config_json) if args.config_json else {}
    if args.config_env:  # taken out of the environment: nothing this process starts inherits it
        data.update(json.loads(os.environ.pop(args.config_env)))
    for key in ("host", "port", "warm_workers", "max_running", "isolation"):
        if getattr(args, key) is not None:
            data[key] = getattr(args, key)
    cfg = ServerConfig.model_validate(data)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    if (problem := cfg.full_load_problem()) is not None:  # a run's own service refuses it
        logging.getLogger(__name__).warning("%s", problem)
    serve(cfg)


CONFIG_ENV = "AGENTRL_SANDBOX_CONFIG"


class LocalService:
    """A `python -m agentrl.sandbox.server` child on 127.0.0.1 with a free port (sync or async `with`)."""

    def __init__(self, cfg: ServerConfig | None = None, startup_timeout_s: float = 60.0) -> None:
        base = cfg or ServerConfig()
        self.cfg = base.model_copy(update={"host": "127.0.0.1", "port": 0})
        self.startup_timeout_s = startup_timeout_s
        self.proc: subprocess.Popen | None = None
        self.url = ""

    def start(self) -> str:
        # the config (its token) through the environment: /proc/<pid>/cmdline is world-readable,
        # /proc/<pid>/environ only to this user (a red-team pass read the token from argv)
        cmd = [sys.executable, "-m", "agentrl.sandbox.server", "--config-env", CONFIG_ENV]
        root = os.path.dirname(
            os.path.dirname(os.path.abspath(agentrl.__file__))
        )  # agentrl's parent
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([root, os.environ.get("PYTHONPATH", "")]))
        env[CONFIG_ENV] = self.cfg.model_dump_json()
        self.proc = subprocess.Popen(
            cmd, stdout=subprocess.PIPE, text=True, start_new_session=True, env=env,
            preexec_fn=die_with_parent,
        )  # fmt: skip
        deadline = time.monotonic() + self.startup_timeout_s
        assert self.proc.stdout is not None
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"sandbox server exited with {self.proc.returncode} during start-up; "
                    "its log is above (stderr)"
                )
            ready, _, _ = select.select([self.proc.stdout], [], [], 0.2)
            line = self.proc.stdout.readline() if ready else ""
            if line.startswith(READY_PREFIX):
                self.url = line[len(READY_PREFIX) :].strip()
                self._wait_healthy(deadline)
                return self.url
        self.stop()
        raise RuntimeError(f"sandbox server not ready after {self.startup_timeout_s:g}s")

    def _wait_healthy(self, deadline: float) -> None:
        while time.monotonic() < deadline:
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{self.url}/health", timeout=2.0).status_code == 200:
                    return
            time.sleep(0.05)
        raise RuntimeError(f"sandbox server at {self.url} did not become healthy")

    def health(self) -> dict:
        return httpx.get(f"{self.url}/health", timeout=5.0).json()

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def restart(self) -> str:
        """Stop what is left of this service and start a new one (same config and token, a
        new free port); returns its URL."""
        self.stop()
        return self.start()

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGINT)  # graceful: workers and cgroups are cleaned up
        try:
            self.proc.wait(10.0)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        if self.proc.stdout is not None:
            self.proc.stdout.close()

    def __enter__(self) -> LocalService:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    async def __aenter__(self) -> LocalService:
        await asyncio.to_thread(self.start)
        return self

    async def __aexit__(self, *exc: object) -> None:
        await asyncio.to_thread(self.stop)


if __name__ == "__main__":
    main()
