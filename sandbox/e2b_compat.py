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

Every body is checked before use: not a JSON object, or a field of the wrong type, is a 400 that
names it. At most `e2b_max_sandboxes` sandboxes live at once and `e2b_max_contexts` contexts in
each; beyond, 429 (the service's sessions are capped as well, by `max_sessions`).
"""

from __future__ import annotations

import json
import math
import secrets
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from fastapi import APIRouter, FastAPI, Header, Request, Response
from fastapi.responses import JSONResponse, StreamingResponse

from agentrl.sandbox.admission import Busy
from agentrl.sandbox.base import ExecResult
from agentrl.sandbox.service import LANGUAGES, ExecService, until_disconnect

ENVD_VERSION = "0.4.0"
_TB_HEAD = "Traceback (most recent call last):"


class E2BError(Exception):
    """An error answered in e2b's shape: {"code": status, "message": text}."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def install(app: FastAPI, svc: ExecService, token: str | None, default_timeout: float) -> None:
    """Serve the e2b protocol under /e2b of `app`."""

    @app.exception_handler(E2BError)
    async def e2b_error(request: Request, exc: E2BError) -> JSONResponse:
        return JSONResponse({"code": exc.status, "message": str(exc)}, exc.status)

    app.include_router(_E2BApi(svc, token, default_timeout).router(), prefix="/e2b")


@dataclass
class _Box:
    id: str
    template: str
    expires: float
    contexts: dict[str, dict[str, str]] = field(default_factory=dict)
    executions: int = 0

    def session(self, ctx: str) -> str:
        return f"e2b:{self.id}:{ctx}"


async def _body(request: Request) -> dict[str, Any]:
    """The request's JSON object ({} for no body), else a 400 that says what came instead."""
    raw = await request.body()
    if not raw.strip():
        return {}
    try:
        body = json.loads(raw)
    except ValueError as e:  # not JSON, or not UTF-8
        raise E2BError(400, f"the request body is not JSON: {e}") from None
    if not isinstance(body, dict):
        raise E2BError(400, f"the request body must be a JSON object, not a {_kind(body)}")
    return body


def _kind(value: object) -> str:
    return {dict: "object", list: "list", str: "string", bool: "boolean"}.get(
        type(value), "number" if isinstance(value, int | float) else type(value).__name__
    )


def _str(body: dict[str, Any], key: str, default: str) -> str:
    """body[key] as a string (`default` when absent, null or empty), else a 400."""
    value = body.get(key)
    if value is None or value == "":
        return default
    if not isinstance(value, str):
        raise E2BError(400, f"{key} must be a string, got a {_kind(value)}")
    return value


def _seconds(value: object, name: str, cap: float) -> float:
    """A finite, positive number of seconds up to `cap`, else a 400 that says so."""
    if isinstance(value, bool):
        raise E2BError(400, f"{name} must be a number of seconds, got {value!r}")
    try:
        x = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise E2BError(400, f"{name} must be a number of seconds, got {value!r}") from None
    if not (math.isfinite(x) and 0 < x <= cap):
        raise E2BError(400, f"{name} must be finite, > 0 and <= {cap:g} s, got {value!r}")
    return x


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


class _E2BApi:
    """The e2b routes; state is the live e2b sandboxes (each a group of our sessions)."""

    def __init__(self, svc: ExecService, token: str | None, default_timeout: float) -> None:
        self.svc, self.token, self.default_timeout = svc, token, default_timeout
        self.boxes: dict[str, _Box] = {}
        self.max_boxes = svc.cfg.e2b_max_sandboxes
        self.max_contexts = svc.cfg.e2b_max_contexts

    def router(self) -> APIRouter:
        r = APIRouter()
        r.add_api_route("/sandboxes", self.create, methods=["POST"], status_code=201)
        r.add_api_route("/v2/sandboxes", self.create, methods=["POST"], status_code=201)
        r.add_api_route("/sandboxes/{sid}", self.kill, methods=["DELETE"], status_code=204)
        r.add_api_route("/sandboxes/{sid}/timeout", self.set_timeout, methods=["POST"])
        r.add_api_route("/health", self.envd_health, methods=["GET"])
        r.add_api_route("/contexts", self.create_context, methods=["POST"])
        r.add_api_route("/contexts", self.list_contexts, methods=["GET"])
        r.add_api_route("/contexts/{cid}", self.remove_context, methods=["DELETE"])
        r.add_api_route("/contexts/{cid}/restart", self.restart_context, methods=["POST"])
        r.add_api_route("/execute", self.execute, methods=["POST"])
        return r

    async def _purge(self) -> None:
        now = time.monotonic()
        for box in [b for b in self.boxes.values() if b.expires < now]:
            await self._kill_box(box)

    async def _kill_box(self, box: _Box) -> None:
        self.boxes.pop(box.id, None)
        for ctx in list(box.contexts):
            await self.svc.close_session(box.session(ctx))

    def _check_key(self, key: str | None) -> None:
        if self.token is not None and key != self.token:
            raise E2BError(401, "invalid X-API-KEY: use the sandbox service's token")

    async def _box(self, sid: str | None, request: Request | None = None) -> _Box:
        if self.token is not None and request is not None:  # a data-plane route
            given = request.headers.get("x-access-token") or request.headers.get("x-api-key")
            if given != self.token:
                raise E2BError(401, "missing or wrong X-Access-Token")
        await self._purge()
        box = self.boxes.get(sid or "")
        if box is None:
            raise E2BError(404, f"sandbox {sid!r} not found (killed or timed out)")
        return box

    def _context(self, box: _Box, cid: str) -> dict[str, str]:
        if cid not in box.contexts:
            raise E2BError(404, f"context {cid!r} not found")
        return box.contexts[cid]

    def _add_context(self, box: _Box, ctx: dict[str, str]) -> None:
        if ctx["id"] not in box.contexts and len(box.contexts) >= self.max_contexts:
            raise E2BError(
                429,
                f"sandbox {box.id} has {len(box.contexts)} code contexts, the most this service "
                f"allows (e2b_max_contexts={self.max_contexts}): remove one first",
            )
        box.contexts.setdefault(ctx["id"], ctx)

    # -- control plane (E2B_API_URL) ------------------------------------------------------

    async def create(self, request: Request, x_api_key: str | None = Header(None)) -> dict:
        self._check_key(x_api_key)
        await self._purge()
        body = await _body(request)
        template = _str(body, "templateID", "code-interpreter-v1")
        timeout = _seconds(body.get("timeout", 300), "timeout", 86_400)
        if len(self.boxes) >= self.max_boxes:
            raise E2BError(
                429,
                f"{len(self.boxes)} e2b sandboxes are live, the most this service allows "
                f"(e2b_max_sandboxes={self.max_boxes}): kill one, or wait for one to time out",
            )
        sid = "agentrl" + secrets.token_hex(10)
        self.boxes[sid] = _Box(sid, template, time.monotonic() + timeout)
        out = {
            "templateID": template,
            "sandboxID": sid,
            "clientID": "agentrl",
            "envdVersion": ENVD_VERSION,
            "domain": None,
        }
        if self.token is not None:  # the SDK sends it back as X-Access-Token on the data plane
            out["envdAccessToken"] = self.token
        return out

    async def kill(self, sid: str, x_api_key: str | None = Header(None)) -> Response:
        self._check_key(x_api_key)
        await self._kill_box(await self._box(sid))
        return Response(status_code=204)

    async def set_timeout(
        self, sid: str, request: Request, x_api_key: str | None = Header(None)
    ) -> Response:
        self._check_key(x_api_key)
        box = await self._box(sid)
        timeout = _seconds((await _body(request)).get("timeout", 300), "timeout", 86_400)
        box.expires = time.monotonic() + timeout
        return Response(status_code=204)

    # -- data plane (E2B_SANDBOX_URL; the sandbox id travels in a header) -----------------

    async def envd_health(self, e2b_sandbox_id: str | None = Header(None)) -> Response:
        # says only whether an id is live; ids are 80-bit secrets, no code runs here
        return Response(status_code=204 if e2b_sandbox_id in self.boxes else 502)

    async def create_context(
        self, request: Request, e2b_sandbox_id: str | None = Header(None)
    ) -> dict:
        box = await self._box(e2b_sandbox_id, request)
        body = await _body(request)
        language = _str(body, "language", "python")
        if language != "python":
            raise E2BError(400, f"language {language[:40]!r}: only python contexts are served")
        ctx = {"id": secrets.token_hex(8), "language": language, "cwd": _str(body, "cwd", "/tmp")}
        self._add_context(box, ctx)
        return ctx

    async def list_contexts(
        self, request: Request, e2b_sandbox_id: str | None = Header(None)
    ) -> list:
        return list((await self._box(e2b_sandbox_id, request)).contexts.values())

    async def remove_context(
        self, cid: str, request: Request, e2b_sandbox_id: str | None = Header(None)
    ):
        box = await self._box(e2b_sandbox_id, request)
        self._context(box, cid)
        del box.contexts[cid]
        await self.svc.close_session(box.session(cid))
        return Response(status_code=204)

    async def restart_context(
        self, cid: str, request: Request, e2b_sandbox_id: str | None = Header(None)
    ):
        box = await self._box(e2b_sandbox_id, request)
        self._context(box, cid)
        await self.svc.close_session(box.session(cid))
        return Response(status_code=204)

    async def execute(self, request: Request, e2b_sandbox_id: str | None = Header(None)):
        box = await self._box(e2b_sandbox_id, request)
        body = await _body(request)
        code = _str(body, "code", "")
        language = _str(body, "language", "python")
        if language not in LANGUAGES:
            raise E2BError(400, f"language {language[:40]!r}: one of {LANGUAGES} is served")
        envs = body.get("env_vars") or {}
        if not isinstance(envs, dict):
            raise E2BError(400, f"env_vars must be an object, got a {_kind(envs)}")
        limit = self.svc.lim.max_wall_s
        timeout = _seconds(envs.get("AGENTRL_TIMEOUT", self.default_timeout), "timeout", limit)
        cid = _str(body, "context_id", "")
        if cid:
            self._context(box, cid)
        else:
            cid = f"default-{language}"
            self._add_context(box, {"id": cid, "language": language, "cwd": "/tmp"})
        call = self.svc.run(code, language, timeout, session=box.session(cid))
        try:
            res = await until_disconnect(request, call)
        except Busy as e:
            return JSONResponse({"code": 503, "message": str(e)}, 503, {"Retry-After": "1"})
        except ValueError as e:
            raise E2BError(400, str(e)) from e
        box.executions += 1
        lines = [json.dumps(ev) + "\n" for ev in _events(res, box.executions)]
        return StreamingResponse(iter(lines), media_type="application/x-ndjson")
