"""The subset of the e2b protocol that `e2b-code-interpreter` speaks, served by our service.

Point unchanged e2b client code at a self-hosted agentrl sandbox:

    export E2B_API_URL=http://127.0.0.1:8470/e2b       # control plane: create / kill sandboxes
    export E2B_SANDBOX_URL=http://127.0.0.1:8470/e2b   # data plane: /execute, /contexts
    export E2B_API_KEY=anything                        # or the service's `token` when it has one

    from e2b_code_interpreter import AsyncSandbox
    sbx = await AsyncSandbox.create()
    await sbx.run_code("x = 41")
    print((await sbx.run_code("x + 1")).text)           # 42
    await sbx.kill()

Mapping: an e2b sandbox is a group of our sessions; each code context (the default one per
language, and every `create_code_context`) is one session, i.e. one isolated interpreter with
its own /tmp (in e2b, contexts of one sandbox share a filesystem: here they do not). Output is
sent when the call ends, not streamed. `env_vars` of `run_code` are not applied, except
`AGENTRL_TIMEOUT` (seconds), which sets the call's wall limit (default `e2b_timeout_s`); the
client's own timeout also ends the call, since a dropped connection stops it. Filesystem,
commands and PTY endpoints of e2b's envd are not implemented.
"""

from __future__ import annotations

import json
import secrets
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from fastapi import APIRouter, Header, HTTPException, Request, Response
from fastapi.responses import JSONResponse, StreamingResponse

from sandbox.base import ExecResult
from sandbox.service import Busy, ExecService, until_disconnect

ENVD_VERSION = "0.4.0"
_TB_HEAD = "Traceback (most recent call last):"


@dataclass
class _Box:
    id: str
    template: str
    expires: float
    contexts: dict[str, dict[str, str]] = field(default_factory=dict)
    executions: int = 0

    def session(self, ctx: str) -> str:
        return f"e2b:{self.id}:{ctx}"


def _now() -> str:
    return datetime.now(UTC).isoformat()


def _events(res: ExecResult, count: int) -> list[dict[str, Any]]:
    """One ExecResult as the NDJSON events of e2b's /execute."""
    out: list[dict[str, Any]] = []
    stderr, tb = res.stderr, ""
    if res.error_name and res.error_name != "TimeoutError":
        i = stderr.rfind(_TB_HEAD)
        stderr, tb = (stderr[:i], stderr[i:]) if i >= 0 else ("", stderr)
    if res.stdout:
        out.append({"type": "stdout", "text": res.stdout, "timestamp": _now()})
    if stderr:
        out.append({"type": "stderr", "text": stderr, "timestamp": _now()})
    if res.result is not None:
        out.append({"type": "result", "text": res.result, "is_main_result": True})
    if res.timed_out or res.limit:
        what = "timed out" if res.timed_out else f"stopped: {res.limit} limit"
        out.append({"type": "error", "name": "TimeoutError" if res.timed_out else "LimitError",
                    "value": f"execution {what}", "traceback": ""})  # fmt: skip
    elif res.error_name:
        out.append({"type": "error", "name": res.error_name, "value": res.error_value or "",
                    "traceback": tb})  # fmt: skip
    elif res.exit_code not in (0, None):
        out.append({"type": "error", "name": "SystemExit", "value": str(res.exit_code),
                    "traceback": ""})  # fmt: skip
    out.append({"type": "end_of_execution"})
    out.append({"type": "number_of_executions", "execution_count": count})
    return out


def e2b_router(svc: ExecService, token: str | None, default_timeout: float) -> APIRouter:
    router = APIRouter()
    boxes: dict[str, _Box] = {}

    async def purge() -> None:
        now = time.monotonic()
        for box in [b for b in boxes.values() if b.expires < now]:
            await kill_box(box)

    async def kill_box(box: _Box) -> None:
        boxes.pop(box.id, None)
        for ctx in list(box.contexts):
            await svc.close_session(box.session(ctx))

    def check_key(key: str | None) -> None:
        if token is not None and key != token:
            raise HTTPException(401, "invalid X-API-KEY: use the sandbox service's token")

    async def box_of(sid: str | None) -> _Box:
        await purge()
        box = boxes.get(sid or "")
        if box is None:
            raise HTTPException(404, f"sandbox {sid!r} not found (killed or timed out)")
        return box

    @router.post("/sandboxes", status_code=201)
    @router.post("/v2/sandboxes", status_code=201)
    async def create(request: Request, x_api_key: str | None = Header(None)) -> dict:
        check_key(x_api_key)
        await purge()
        body = await request.json()
        sid = "agentrl" + secrets.token_hex(10)
        template = str(body.get("templateID") or "code-interpreter-v1")
        timeout = float(body.get("timeout") or 300)
        boxes[sid] = _Box(sid, template, time.monotonic() + timeout)
        return {
            "templateID": template,
            "sandboxID": sid,
            "clientID": "agentrl",
            "envdVersion": ENVD_VERSION,
            "domain": None,
        }

    @router.delete("/sandboxes/{sid}", status_code=204)
    async def kill(sid: str, x_api_key: str | None = Header(None)) -> Response:
        check_key(x_api_key)
        await kill_box(await box_of(sid))
        return Response(status_code=204)

    @router.post("/sandboxes/{sid}/timeout", status_code=204)
    async def set_timeout(sid: str, request: Request, x_api_key: str | None = Header(None)):
        check_key(x_api_key)
        box = await box_of(sid)
        box.expires = time.monotonic() + float((await request.json()).get("timeout", 300))
        return Response(status_code=204)

    @router.get("/health")
    async def envd_health(e2b_sandbox_id: str | None = Header(None)) -> Response:
        return Response(status_code=204 if e2b_sandbox_id in boxes else 502)

    @router.post("/contexts")
    async def create_context(request: Request, e2b_sandbox_id: str | None = Header(None)):
        box = await box_of(e2b_sandbox_id)
        body = await request.json()
        language = body.get("language") or "python"
        if language != "python":
            raise HTTPException(400, f"language {language!r}: only python contexts are served")
        ctx = {"id": secrets.token_hex(8), "language": language, "cwd": body.get("cwd") or "/tmp"}
        box.contexts[ctx["id"]] = ctx
        return ctx

    @router.get("/contexts")
    async def list_contexts(e2b_sandbox_id: str | None = Header(None)) -> list:
        return list((await box_of(e2b_sandbox_id)).contexts.values())

    @router.delete("/contexts/{cid}")
    async def remove_context(cid: str, e2b_sandbox_id: str | None = Header(None)):
        box = await box_of(e2b_sandbox_id)
        if box.contexts.pop(cid, None) is None:
            raise HTTPException(404, f"context {cid!r} not found")
        await svc.close_session(box.session(cid))
        return Response(status_code=204)

    @router.post("/contexts/{cid}/restart")
    async def restart_context(cid: str, e2b_sandbox_id: str | None = Header(None)):
        box = await box_of(e2b_sandbox_id)
        if cid not in box.contexts:
            raise HTTPException(404, f"context {cid!r} not found")
        await svc.close_session(box.session(cid))
        return Response(status_code=204)

    @router.post("/execute")
    async def execute(request: Request, e2b_sandbox_id: str | None = Header(None)):
        box = await box_of(e2b_sandbox_id)
        body = await request.json()
        cid = body.get("context_id")
        language = body.get("language") or "python"
        if cid and cid not in box.contexts:
            raise HTTPException(404, f"context {cid!r} not found")
        envs = body.get("env_vars") or {}
        timeout = float(envs.get("AGENTRL_TIMEOUT", default_timeout))
        key = box.session(cid or f"default-{language}")
        if not cid:
            box.contexts.setdefault(f"default-{language}", {"id": f"default-{language}",
                                    "language": language, "cwd": "/tmp"})  # fmt: skip
        try:
            res = await until_disconnect(
                request, svc.run(body.get("code", ""), language, timeout, session=key)
            )
        except Busy as e:
            return JSONResponse({"message": str(e)}, 503, {"Retry-After": "1"})
        except ValueError as e:
            raise HTTPException(400, str(e)) from e
        box.executions += 1
        lines = [json.dumps(ev) + "\n" for ev in _events(res, box.executions)]
        return StreamingResponse(iter(lines), media_type="application/x-ndjson")

    return router
