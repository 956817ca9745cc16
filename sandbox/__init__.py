"""Code-execution backends behind one contract (`sandbox.base.Sandbox`).

    from sandbox import SandboxConfig, make_sandbox

    sb = make_sandbox(SandboxConfig(backend="service", url="http://127.0.0.1:8470"))
    res = await sb.run("print(6 * 7)", timeout=5.0)             # res.stdout == "42\\n"
    await sb.aclose()

Backends: "subprocess" (rlimits only, no service needed), "service" (the isolated local
service, `python -m sandbox.server`; with no `url` one is started and owned by the client),
"e2b" (e2b code-interpreter sandboxes; `pip install agentrl[e2b]`).
"""

from __future__ import annotations

from sandbox.base import ExecResult, Sandbox, SandboxUnavailable
from sandbox.client import ServiceSandbox
from sandbox.config import E2BConfig, Limits, SandboxConfig, ServerConfig
from sandbox.subproc import SubprocessSandbox

__all__ = [
    "E2BConfig",
    "ExecResult",
    "Limits",
    "Sandbox",
    "SandboxConfig",
    "SandboxUnavailable",
    "ServerConfig",
    "ServiceSandbox",
    "SubprocessSandbox",
    "make_sandbox",
]


def make_sandbox(cfg: SandboxConfig | None = None) -> Sandbox:
    """Build the configured backend. For `backend="service"` without `url` this starts a local
    service (blocking until healthy, a second or two) that `aclose()` stops."""
    cfg = cfg or SandboxConfig()
    if cfg.backend == "subprocess":
        lim = cfg.limits
        return SubprocessSandbox(
            memory_mb=lim.memory_mb,
            max_output_bytes=lim.output_bytes,
            file_size_mb=lim.file_size_mb,
            max_concurrency=min(cfg.max_concurrency, 64),
        )
    if cfg.backend == "service":
        owner = None
        url = cfg.url
        if url is None:
            from sandbox.server import LocalService

            owner = LocalService(cfg.server)
            url = owner.start()
        return ServiceSandbox(
            url,
            token=cfg.token or cfg.server.token,
            retries=cfg.retries,
            backoff_s=cfg.backoff_s,
            backoff_max_s=cfg.backoff_max_s,
            max_concurrency=cfg.max_concurrency,
            owner=owner,
        )
    if cfg.backend == "e2b":
        from sandbox.e2b_backend import E2BSandbox

        return E2BSandbox(
            cfg.e2b, retries=cfg.retries, backoff_s=cfg.backoff_s, backoff_max_s=cfg.backoff_max_s
        )
    raise ValueError(f"unknown sandbox backend {cfg.backend!r}; use subprocess, service or e2b")
