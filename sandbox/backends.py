"""Sandbox backends by name (`sandbox.backend`): subprocess, service, e2b, or an import path to
a factory `fn(cfg: SandboxConfig) -> Sandbox` of your own (`sandbox.backend=my_pkg.sb:make`).

    @BACKENDS.register("my_cloud")
    def make_my_cloud(cfg: SandboxConfig) -> Sandbox: ...
"""

from __future__ import annotations

import secrets
from collections.abc import Callable

from agentrl.registry import Registry
from agentrl.sandbox.base import Sandbox
from agentrl.sandbox.client import ServiceSandbox
from agentrl.sandbox.config import SandboxConfig
from agentrl.sandbox.subproc import SubprocessSandbox

BackendFactory = Callable[[SandboxConfig], Sandbox]
BACKENDS: Registry[BackendFactory] = Registry(
    "sandbox backend", "sandbox.backend", called_with=("cfg",)
)


def make_sandbox(cfg: SandboxConfig | None = None) -> Sandbox:
    """Build the configured backend. For `backend="service"` without `url` this starts a local
    service (blocking until healthy, a second or two) that `aclose()` stops."""
    cfg = cfg or SandboxConfig()
    sandbox = BACKENDS.get(cfg.backend)(cfg)
    if not isinstance(sandbox, Sandbox):
        raise TypeError(
            f"sandbox.backend={cfg.backend!r} returned {type(sandbox).__name__}, not a "
            "agentrl.sandbox.base.Sandbox"
        )
    return sandbox


@BACKENDS.register("subprocess")
def _subprocess(cfg: SandboxConfig) -> Sandbox:
    lim = cfg.limits
    return SubprocessSandbox(
        memory_mb=lim.memory_mb,
        max_output_bytes=lim.output_bytes,
        file_size_mb=lim.file_size_mb,
        max_concurrency=min(cfg.max_concurrency, 64),
    )


@BACKENDS.register("service")
def _service(cfg: SandboxConfig) -> Sandbox:
    """A service given by `url` (with its `token`), or one started here on 127.0.0.1 that only
    this client can call: it takes a random token unless `server.token` names one, and it is
    restarted if it dies (`max_restarts`)."""
    owner, url, token = None, cfg.url, cfg.token or cfg.server.token
    if url is None:
        from agentrl.sandbox.server import LocalService  # local: starts the service's machinery

        token = token or secrets.token_urlsafe(32)
        owner = LocalService(cfg.server.model_copy(update={"token": token}))
        url = owner.start()
    return ServiceSandbox(
        url,
        token=token,
        retries=cfg.retries,
        backoff_s=cfg.backoff_s,
        backoff_max_s=cfg.backoff_max_s,
        max_concurrency=cfg.max_concurrency,
        owner=owner,
        max_restarts=cfg.max_restarts,
    )


@BACKENDS.register("e2b")
def _e2b(cfg: SandboxConfig) -> Sandbox:
    from agentrl.sandbox.e2b_backend import E2BSandbox  # local: the e2b extra is optional

    return E2BSandbox(
        cfg.e2b, retries=cfg.retries, backoff_s=cfg.backoff_s, backoff_max_s=cfg.backoff_max_s
    )
