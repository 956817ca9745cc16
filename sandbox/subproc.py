"""SubprocessSandbox: run a snippet in a fresh local interpreter with rlimits and a timeout.

What it limits: wall time (the whole process group is killed), CPU time, address space, file size,
output size; the child gets an empty environment (no API keys or tokens of the parent), an isolated
Python (`-I`: no user site, no PYTHON* variables) and a private temporary working directory.
What it does NOT isolate: the filesystem (the child can read what the user can), the network, and
other processes. Use the sandbox service (`python -m agentrl.sandbox.server`) for untrusted code at scale;
this backend exists so the python tool works with no service running. It is stateless: `session`
is accepted and ignored.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import resource
import signal
import sys
import tempfile
import time

from agentrl.sandbox.base import ExecResult

_LANGS = {"python": [sys.executable, "-I", "-c"], "bash": ["/bin/bash", "-c"]}


def _limits(cpu_s: int, mem_bytes: int, fsize_bytes: int):
    def apply() -> None:
        resource.setrlimit(resource.RLIMIT_CPU, (cpu_s, cpu_s + 1))
        resource.setrlimit(resource.RLIMIT_AS, (mem_bytes, mem_bytes))
        resource.setrlimit(resource.RLIMIT_FSIZE, (fsize_bytes, fsize_bytes))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))

    return apply


class SubprocessSandbox:
    def __init__(
        self,
        memory_mb: int = 1024,
        max_output_bytes: int = 64 * 1024,
        file_size_mb: int = 16,
        max_concurrency: int = 8,
    ) -> None:
        self.memory_mb = memory_mb
        self.max_output_bytes = max_output_bytes
        self.file_size_mb = file_size_mb
        self._sem = asyncio.Semaphore(max_concurrency)

    async def run(
        self,
        code: str,
        language: str = "python",
        timeout: float = 10.0,
        session: str | None = None,
    ) -> ExecResult:
        if language not in _LANGS:
            return ExecResult(stderr=f"unsupported language {language!r}", exit_code=2)
        # the code's own faults, as the service reports them, not an exception of this tool's (a
        # red-team pass): a NUL cannot ride a command line, and lone surrogates become U+FFFD
        if "\x00" in code:
            return ExecResult(
                stderr="the code holds a NUL byte, which no program text may hold\n", exit_code=1
            )
        code = code.encode("utf-8", "surrogatepass").decode("utf-8", "replace")
        async with self._sem:
            return await self._run(_LANGS[language] + [code], timeout)

    async def _run(self, argv: list[str], timeout: float) -> ExecResult:
        t0 = time.monotonic()
        with tempfile.TemporaryDirectory(prefix="agentrl-sbx-") as tmp:
            proc = await asyncio.create_subprocess_exec(
                *argv,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                cwd=tmp,
                env={"PATH": "/usr/bin:/bin", "HOME": tmp, "TMPDIR": tmp, "LANG": "C.UTF-8"},
                start_new_session=True,
                preexec_fn=_limits(int(timeout) + 1, self.memory_mb << 20, self.file_size_mb << 20),
            )
            out_task = asyncio.create_task(self._read(proc.stdout))
            err_task = asyncio.create_task(self._read(proc.stderr))
            timed_out = False
            try:
                await asyncio.wait_for(proc.wait(), timeout)
            except TimeoutError:
                timed_out = True
            finally:
                _kill_group(proc.pid)
                await proc.wait()
            (out, out_cut), (err, err_cut) = await out_task, await err_task
        limit = "wall_time" if timed_out else None
        if proc.returncode == -signal.SIGXCPU:
            limit = "cpu_time"
        if out_cut or err_cut:
            limit = limit or "output"
        return ExecResult(
            stdout=out.decode("utf-8", "replace"),
            stderr=err.decode("utf-8", "replace"),
            exit_code=None if timed_out else proc.returncode,
            timed_out=timed_out,
            limit=limit,
            duration_s=time.monotonic() - t0,
            truncated=out_cut or err_cut,
        )

    async def _read(self, stream: asyncio.StreamReader) -> tuple[bytes, bool]:
        buf = bytearray()
        cut = False
        while chunk := await stream.read(65536):
            room = self.max_output_bytes - len(buf)
            if len(chunk) > room:
                cut = True
            buf += chunk[: max(room, 0)]
        return bytes(buf), cut

    async def close_session(self, session: str) -> None:
        return None

    async def aclose(self) -> None:
        return None


def _kill_group(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGKILL)
