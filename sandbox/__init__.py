"""Code-execution backends behind one contract (`agentrl.sandbox.base.Sandbox`).

    from agentrl.sandbox import SandboxConfig, make_sandbox

    sb = make_sandbox(SandboxConfig(backend="service", url="http://127.0.0.1:8470"))
    res = await sb.run("print(6 * 7)", timeout=5.0)             # res.stdout == "42\\n"
    await sb.aclose()

Backends: "subprocess" (rlimits only, no service needed), "service" (the isolated local
service, `python -m agentrl.sandbox.server`; with no `url` one is started and owned by the client),
"e2b" (e2b code-interpreter sandboxes; `pip install agentrl[e2b]`), or your own: a factory
registered with `@sandbox.BACKENDS.register("name")` or named by import path (backends.py).
"""

from __future__ import annotations

from agentrl.sandbox.backends import BACKENDS, make_sandbox
from agentrl.sandbox.base import ExecResult, Sandbox, SandboxUnavailable
from agentrl.sandbox.client import ServiceSandbox
from agentrl.sandbox.config import E2BConfig, Limits, SandboxConfig, ServerConfig
from agentrl.sandbox.subproc import SubprocessSandbox

__all__ = [
    "BACKENDS",
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
