"""One run per directory. A training run holds `.agentrl.lock` in its output dir (runs/<run_name>/)
and in its checkpoint dir (runs/<run_name>/checkpoints, or checkpoint.dir), from before anything
there is moved or written (the archive step, the checkpoint staging cleanup) until it exits.

The lock is `fcntl.flock` on the file: the kernel drops it when the holder exits, however it exits
(an error, Ctrl-C, SIGKILL, OOM), so a dead run never blocks the next one. The file keeps the
holder's pid, host and start time for the message a second run gets; one that still names a
holder when its lock is free was left by a run that died, and is taken over with a console line.
flock is per open file, so a second open in the same process is refused like another process's.
`agentrl preview` writes under runs/<run_name>/preview/<time>/ (never the run's own files) and
holds the lock of that dir only, so it runs beside a training run without touching it.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
import time
from collections.abc import Iterator
from pathlib import Path

from agentrl.types import ConfigError

LOCK_NAME = ".agentrl.lock"


def _holder(fd: int) -> dict:
    os.lseek(fd, 0, os.SEEK_SET)
    raw = os.read(fd, 4096)
    try:
        got = json.loads(raw) if raw.strip() else {}
    except ValueError:
        got = {"pid": "?", "host": "?", "started": f"unreadable lock file ({raw[:40]!r})"}
    return got if isinstance(got, dict) else {}


def _describe(h: dict) -> str:
    return f"pid {h.get('pid', '?')} on {h.get('host', '?')}, started {h.get('started', '?')}"


def _alive_here(h: dict) -> bool | None:
    """Whether the holder's pid runs (None: another host, or no pid)."""
    if h.get("host") != socket.gethostname() or not isinstance(h.get("pid"), int):
        return None
    try:
        os.kill(h["pid"], 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _take(dir_: Path, what: str, probe: bool = False) -> tuple[int, str | None]:
    """Lock `dir_` (created if missing); (fd, a note when a dead run's lock was taken over).
    `probe`: let go at once, the file as it was (-1, None)."""
    dir_.mkdir(parents=True, exist_ok=True)
    path = dir_ / LOCK_NAME
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        h = _holder(fd)
        os.close(fd)
        fix = " (and another checkpoint.dir)" if "checkpoint.dir" in what else ""
        gone = _alive_here(h) is False  # flock held, its pid dead: a child it started holds it
        child = " (gone, but a process it started still has the lock open: stop it)" if gone else ""
        raise ConfigError(
            f"{dir_} ({what}) is in use by another run: {_describe(h)}{child}. Two runs in one "
            f"dir move each other's logs and write over each other's checkpoints: start this "
            f"one with run_name=<another name>{fix}, or stop the other run first"
        ) from None
    except BaseException:
        os.close(fd)
        raise
    if probe:
        os.close(fd)
        return -1, None
    h = _holder(fd)
    me = {"pid": os.getpid(), "host": socket.gethostname(),
          "started": time.strftime("%Y-%m-%d %H:%M:%S %z")}  # fmt: skip
    os.ftruncate(fd, 0)
    os.pwrite(fd, json.dumps(me).encode() + b"\n", 0)
    note = None
    if h:  # a clean exit empties the file: this one's holder died holding it
        note = f"took over the lock of {dir_} from a run that is gone ({_describe(h)})"
    return fd, note


def _release(fd: int) -> None:
    try:
        os.ftruncate(fd, 0)  # empty: the next run knows this one ended cleanly
    finally:
        os.close(fd)  # closing drops the flock


@contextlib.contextmanager
def hold_run_dirs(out: Path, ckpt_dir: Path | None = None, say=print) -> Iterator[None]:
    """Hold the lock of the run's output dir, and of its checkpoint dir when that is not inside
    it, for the body; a dir another live run holds is a ConfigError (one line: the dir, the
    holder, the fix). `say` gets the line for a lock taken over from a dead run."""
    with contextlib.ExitStack() as stack:
        for d, what in _dirs(out, ckpt_dir):
            fd, note = _take(d, what)
            stack.callback(_release, fd)
            if note:
                say(note)
        yield


def refuse_if_held(out: Path, ckpt_dir: Path | None = None) -> None:
    """The ConfigError `hold_run_dirs` would raise, creating and changing nothing: for what must
    not run beside a live run before the lock is taken (the checkpoint lookup clears the
    checkpoint dir's staging)."""
    for d, what in _dirs(out, ckpt_dir):
        if (d / LOCK_NAME).is_file():
            _take(d, what, probe=True)


def _dirs(out: Path, ckpt_dir: Path | None) -> list[tuple[Path, str]]:
    """The output dir, and the checkpoint dir even inside it: another run may name that one as
    its checkpoint.dir (runs/a/checkpoints), and the output dir's lock is not the one it takes
    (a red-team pass: it set the live run's checkpoints aside as an earlier run's, then wrote
    its own steps over them)."""
    out = Path(out).expanduser().resolve()
    dirs = [(out, "the run's output dir")]
    if ckpt_dir is not None:
        ckpt = Path(ckpt_dir).expanduser().resolve()
        if ckpt != out:
            dirs.append((ckpt, "its checkpoint dir, checkpoint.dir"))
    return dirs
