"""The dev server's HTTP routes (agentrl/engine/dev/server.py): generation and health, SGLang's admin
routes (weight version, cache, abort, pause, memory occupation), its weight updates, and the key
every route but /health asks for (`BearerAuth`). The LoRA routes are in agentrl/engine/dev/lora.py."""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse

from agentrl.engine.dev.request import BadRequest

DevServer = Any  # agentrl.engine.dev.server.DevServer (which imports this module)
MEMORY_TAGS = ("weights", "kv_cache", "cuda_graph")
log = logging.getLogger("agentrl.engine.dev")


async def _body(request: Request) -> dict[str, Any]:
    raw = await request.body()
    try:
        data = json.loads(raw) if raw.strip() else {}
    except ValueError as e:
        raise BadRequest(f"the body is not JSON: {e}") from e
    if not isinstance(data, dict):
        raise BadRequest("the body must be a JSON object")
    return data


class BearerAuth:
    """ASGI middleware: every route but /health answers 401 without `Authorization: Bearer <key>`,
    as SGLang started with --api-key and --admin-api-key does (there /health*, /metrics stay
    open; here /health_generate wants the key too: a generation on a server whose memory is
    released kills it). Plain ASGI: Starlette's BaseHTTPMiddleware would hide client disconnects
    from /generate, which aborts on them."""

    def __init__(self, app: Callable, key: str) -> None:
        self.app, self.key = app, key.encode()

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if scope["type"] == "http" and scope["path"] != "/health":
            given = dict(scope["headers"]).get(b"authorization", b"")
            scheme, _, token = given.partition(b" ")
            if not (scheme.lower() == b"bearer" and hmac.compare_digest(token, self.key)):
                refuse = JSONResponse({"error": "Unauthorized"}, status_code=401)
                await refuse(scope, receive, send)
                return
        await self.app(scope, receive, send)


def _ok(content: Any = None) -> JSONResponse:
    return JSONResponse(content if content is not None else {"success": True})


def add_generation_routes(app: FastAPI, server: DevServer) -> None:
    @app.api_route("/generate", methods=["POST", "PUT"])
    async def generate(request: Request) -> JSONResponse:
        out, status = await server.generate(await _body(request), request)
        return JSONResponse(out, status_code=status)

    @app.get("/health")
    async def health() -> PlainTextResponse:
        return PlainTextResponse("", status_code=200 if server.alive else 503)

    @app.get("/health_generate")
    async def health_generate() -> PlainTextResponse:
        if not server.alive:
            return PlainTextResponse("", status_code=503)
        if server.paused:  # a paused scheduler would never answer; report the process as up
            return PlainTextResponse("", status_code=200)
        probe = {"input_ids": [0], "sampling_params": {"max_new_tokens": 1, "temperature": 0}}
        try:
            _, status = await asyncio.wait_for(server.generate(probe), timeout=20)
        except TimeoutError:
            status = 503
        return PlainTextResponse("", status_code=200 if status == 200 else 503)

    @app.get("/model_info")
    @app.get("/get_model_info")  # SGLang's older name
    async def model_info() -> JSONResponse:
        return _ok(server.model_info())

    @app.get("/server_info")
    @app.get("/get_server_info")
    async def server_info() -> JSONResponse:
        return _ok(server.server_info())

    @app.get("/get_weight_version")
    async def get_weight_version() -> JSONResponse:
        return _ok({"weight_version": server.weight_version})


def add_admin_routes(app: FastAPI, server: DevServer) -> None:
    @app.post("/update_weight_version")
    async def update_weight_version(request: Request) -> JSONResponse:
        b = await _body(request)
        if not b.get("new_version"):
            raise BadRequest("new_version is required")
        if b.get("abort_all_requests", True):
            await server.abort(None, True, "aborted by /update_weight_version")
        server.weight_version = str(b["new_version"])
        msg = f"Weight version updated to {server.weight_version}"
        return _ok({"success": True, "message": msg, "new_version": server.weight_version})

    @app.api_route("/flush_cache", methods=["GET", "POST"])
    async def flush_cache() -> PlainTextResponse:
        busy = bool(server.inflight)
        if busy:
            text = "Cache not flushed: requests are running or waiting.\n"
        else:
            server.engine.prefix.clear()
            text = "Cache flushed.\n"
        return PlainTextResponse(text, status_code=400 if busy else 200)

    @app.post("/abort_request")
    async def abort_request(request: Request) -> JSONResponse:
        b = await _body(request)
        n = await server.abort(b.get("rid"), bool(b.get("abort_all")), "aborted by /abort_request")
        return _ok({"success": True, "num_aborted": n})

    @app.post("/pause_generation")
    async def pause_generation(request: Request) -> JSONResponse:
        await server.pause((await _body(request)).get("mode", "abort"))
        return _ok({"message": "Generation paused successfully.", "status": "ok"})

    @app.post("/continue_generation")
    async def continue_generation() -> JSONResponse:
        await server.resume()
        return _ok({"message": "Generation continued successfully.", "status": "ok"})

    @app.api_route("/release_memory_occupation", methods=["GET", "POST"])
    @app.api_route("/resume_memory_occupation", methods=["GET", "POST"])
    async def memory_occupation(request: Request) -> JSONResponse:
        tags = (await _body(request)).get("tags") or list(MEMORY_TAGS)
        if request.url.path.startswith("/release"):
            server.released |= set(tags)
        else:
            server.released -= set(tags)
        msg = f"released {sorted(server.released)} (the dev server keeps them in host memory)"
        return _ok({"success": True, "message": msg})


def add_weight_routes(app: FastAPI, server: DevServer) -> None:
    """SGLang's weight-update routes: a failure answers {"success": false, "message"} with 400."""
    admin = {
        "/update_weights_from_disk": server.update_from_disk,
        "/init_weights_update_group": server.init_group,
        "/update_weights_from_distributed": server.update_from_distributed,
        "/destroy_weights_update_group": server.destroy_group,
        "/update_weights_from_tensor": server.update_from_tensor,
    }

    def admin_route(fn: Callable[[dict], Awaitable[dict]]) -> Callable:
        async def route(request: Request) -> JSONResponse:
            try:
                return _ok(await fn(await _body(request)))
            except Exception as e:  # SGLang's weight routes answer {"success": false, ...}: 400
                if not isinstance(e, BadRequest):
                    log.exception("%s failed", request.url.path)
                msg = str(e) if isinstance(e, BadRequest) else f"{type(e).__name__}: {e}"
                return JSONResponse({"success": False, "message": msg}, status_code=400)

        return route

    for path, fn in admin.items():
        app.add_api_route(path, admin_route(fn), methods=["POST"])
