"""The shell behind the `bash` tool (tools/shell.py), as it runs inside the episode's sandbox.

This file is not imported by agentrl: its source is sent to the episode's sandbox session (a
Python session, any backend with sessions) and executed there once per session; stdlib only.
It keeps one `bash --noprofile --norc` process per session, so the working directory,
variables, functions and background jobs persist between calls, as in a terminal.

A call: the command is handed to the shell as a quoted here-document and `eval`ed in the shell
itself with stdin from /dev/null (a command that reads stdin sees end of file instead of eating
the next command), followed by a line with a random marker and the exit status. Output (stdout
and stderr merged, in order) is read until the marker; only its first and last `cap / 2`
bytes are kept, the middle replaced by a note, so a command that prints gigabytes costs
constant memory. Past the timeout every process of the shell's group but the shell is killed
(SIGKILL), which ends the command and the shell carries on (its directory and variables kept);
a shell that is itself busy (a `while true` loop in bash) is killed and started afresh, and the
answer says what was lost. A shell that exits (`exit`, `set -e`) is started afresh on the next
call.

The session's code is the policy's: anything here may be replaced by it, so the host reads the
answer with `ast.literal_eval` and shows it to the model only; nothing graded reads it.
"""

import contextlib
import os
import secrets
import select
import signal
import subprocess
import time

_NOTE_CUT = "\n[... {n} bytes cut ...]\n"


class AgentrlBash:
    def __init__(self, cwd):
        self.cwd = cwd
        self.proc = None

    def _start(self):
        env = dict(os.environ)
        env.update(PS1="", PS2="", TERM="dumb", PAGER="cat", GIT_PAGER="cat", MANPAGER="cat")
        cwd = self.cwd if self.cwd and os.path.isdir(self.cwd) else None
        self.proc = subprocess.Popen(
            ["bash", "--noprofile", "--norc"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            cwd=cwd,
            env=env,
            start_new_session=True,
        )
        os.set_blocking(self.proc.stdout.fileno(), False)

    def _group(self):
        """Pids of the shell's process group other than the shell (the command's processes)."""
        pids = []
        for name in os.listdir("/proc"):
            if not name.isdigit() or int(name) == self.proc.pid:
                continue
            try:
                with open(f"/proc/{name}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[2]) == self.proc.pid:  # field 5 of stat: the process group
                pids.append(int(name))
        return pids

    def _kill_children(self):
        for pid in self._group():
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)

    def _restart(self):
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(OSError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        self.proc = None

    def run(self, command, timeout, cap, restart=False):
        """(output, exit status or None, what happened: "ok" | "timeout" | "restarted" |
        "exited" | "started")."""
        notes = []
        if restart:
            self._restart()
            if not command:
                self._start()
                return "", 0, "started"
        if self.proc is None or self.proc.poll() is not None:
            if self.proc is not None:
                notes.append(f"[the shell had exited (status {self.proc.returncode}): new shell]")
            self._start()
        marker = "__agentrl_" + secrets.token_hex(8) + "__"
        delim = "AGENTRL_EOF_" + secrets.token_hex(8)
        script = (
            f"__agentrl_cmd=$(cat <<'{delim}'\n{command}\n{delim}\n)\n"
            f'eval "$__agentrl_cmd" < /dev/null\n'
            f"printf '{marker}%d\\n' $?\n"
        )  # the marker line alone: one write (bash flushes its printf at each newline)
        try:
            self.proc.stdin.write(script.encode("utf-8", "surrogateescape"))
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError):
            pass
        out = _Capped(cap, marker)
        status, state = self._read(out, time.monotonic() + timeout)
        if state == "timeout":
            self._kill_children()
            status, state = self._read(out, time.monotonic() + 2.0)
            if state == "timeout":  # the shell itself is busy: start again
                self._restart()
                return (
                    _join(
                        notes,
                        out.text(),
                        f"[timed out after {timeout:g}s; the shell was restarted: "
                        "its working directory, variables and jobs are gone]",
                    ),
                    None,
                    "restarted",
                )
            return (
                _join(notes, out.text(), f"[timed out after {timeout:g}s: interrupted]"),
                None,
                "timeout",
            )
        if state == "exited":
            code = self.proc.returncode
            self.proc = None
            return _join(notes, out.text(), f"[the shell exited with status {code}; the next "
                         "call starts a new one]"), code, "exited"  # fmt: skip
        return _join(notes, out.text()), status, "ok"

    def _read(self, out, deadline):
        fd = self.proc.stdout.fileno()
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return None, "timeout"
            ready, _, _ = select.select([fd], [], [], min(left, 0.5))
            if not ready:
                if self.proc.poll() is not None:
                    return None, "exited"
                continue
            try:
                chunk = os.read(fd, 65536)
            except BlockingIOError:
                continue
            if not chunk:
                self.proc.wait()
                return None, "exited"
            status = out.feed(chunk)
            if status is not None:
                return status, "ok"


class _Capped:
    """The first and last cap/2 bytes of a stream up to its marker line, and its length. The
    marker is looked for in all of each chunk (and the few bytes before it, where it may have
    begun), and not after a newline: beside a background job printing fast, the marker fell in
    the middle of a 64 KB read (only its last 4 KB were searched), or the job's output came
    between the newline and the marker (bash wrote them apart), so a command that had finished
    was reported timed out and the shell restarted."""

    def __init__(self, cap, marker):
        self.half = max(cap // 2, 64)
        self.token = marker.encode()
        self.head = b""
        self.tail = b""
        self.pending = b""  # the stream's last bytes, not yet kept: a marker may start there
        self.total = 0

    def feed(self, chunk):
        """Take `chunk`: the shell's exit status once its marker line is complete, else None.
        What follows the marker line (a background job's output) is not this command's."""
        data = self.pending + chunk
        at = data.find(self.token)
        if at < 0:
            split = max(0, len(data) - len(self.token) + 1)
            self._add(data[:split])
            self.pending = data[split:]
            return None
        self._add(data[:at])
        self.pending = data[at:]
        end = data.find(b"\n", at + len(self.token))
        if end < 0:
            return None  # the status digits are still coming
        digits = data[at + len(self.token) : end]
        self.pending = b""
        return int(digits) if digits.isdigit() else 0

    def _add(self, chunk):
        self.total += len(chunk)
        room = self.half - len(self.head)
        if room > 0:
            self.head += chunk[:room]
            chunk = chunk[room:]
        self.tail = (self.tail + chunk)[-self.half :]

    def text(self):
        middle = self.total - len(self.head) - len(self.tail)
        text = self.head.decode("utf-8", "replace")
        if middle > 0:
            text += _NOTE_CUT.format(n=middle)
        return text + (self.tail + self.pending).decode("utf-8", "replace")


def _join(*parts):
    notes, *rest = parts
    return "\n".join(p for p in [*notes, *rest] if p)
