"""Code-execution backends behind one contract (`sandbox.base.Sandbox`)."""

from sandbox.base import ExecResult, Sandbox, SandboxUnavailable
from sandbox.subproc import SubprocessSandbox

__all__ = ["ExecResult", "Sandbox", "SandboxUnavailable", "SubprocessSandbox"]
