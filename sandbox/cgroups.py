"""Per-worker cgroups: one memory limit and one process/thread limit for a whole sandbox.

rlimits are per process; a fork bomb multiplies them. A cgroup bounds the sum: resident memory
(including what the code writes to its tmpfs) and the number of tasks. It also counts the CPU
time of everything the sandbox ever ran (v1 `cpuacct`, v2 `cpu.stat`), dead processes included,
which the service holds against `session_cpu_s`. cgroup v1 (separate `memory`, `pids` and
`cpuacct` hierarchies) and v2 (one hierarchy with both controllers delegated) are supported; creating cgroups needs write access to the hierarchy (root, or a delegated subtree).
When neither is usable, `CgroupRoot.detect` returns None and the service says so on /health.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path

log = logging.getLogger(__name__)


def _mounts() -> list[tuple[str, str, set[str]]]:
    """(mount point, fs type, super options) of cgroup mounts."""
    out = []
    with contextlib.suppress(OSError), open("/proc/self/mountinfo") as f:
        for line in f:
            pre, _, post = line.partition(" - ")
            fstype, _, opts = post.split()[:3]
            if fstype in ("cgroup", "cgroup2"):
                out.append((pre.split()[4], fstype, set(opts.split(","))))
    return out


def _own_paths() -> dict[str, str]:
    """controller (or '' for v2) -> path of this process's cgroup."""
    out = {}
    with contextlib.suppress(OSError), open("/proc/self/cgroup") as f:
        for line in f:
            _, ctrls, path = line.rstrip("\n").split(":", 2)
            for c in ctrls.split(",") if ctrls else [""]:
                out[c] = path
    return out


def _base(mount: str, own: str | None) -> Path:
    """Our own cgroup inside `mount` when visible there (so limits nest), else the mount."""
    if own:
        p = Path(mount) / own.lstrip("/")
        if p.is_dir():
            return p
    return Path(mount)


def _write(path: Path, value: str) -> bool:
    try:
        path.write_text(value)
        return True
    except OSError:
        return False


def _read_int(path: Path) -> int:
    try:
        return int(path.read_text())
    except (OSError, ValueError):
        return 0


def _read_counter(path: Path, key: str) -> int:
    with contextlib.suppress(OSError, ValueError):
        for line in path.read_text().splitlines():
            k, _, v = line.partition(" ")
            if k == key:
                return int(v)
    return 0


@dataclass
class Cgroup:
    """The cgroup(s) of one worker. `procs_files` get the worker's pid before it execs."""

    version: int
    dirs: list[Path]
    mem_dir: Path | None
    pids_dir: Path | None
    procs_files: list[str] = field(default_factory=list)
    cpu_dir: Path | None = None

    def cpu_seconds(self) -> float | None:
        """CPU seconds of every process this cgroup ever held, reaped or auto-reaped ones
        included (a process's own counters lose those); None where it is not counted."""
        if self.cpu_dir is None:
            return None
        if self.version == 2:
            return _read_counter(self.cpu_dir / "cpu.stat", "usage_usec") / 1e6
        return _read_int(self.cpu_dir / "cpuacct.usage") / 1e9

    def counters(self) -> tuple[int, int]:
        """(OOM kills, refused forks) so far; compare before/after a call."""
        oom = pids = 0
        if self.mem_dir is not None:
            if self.version == 2:
                oom = _read_counter(self.mem_dir / "memory.events", "oom_kill")
            else:
                ctl = self.mem_dir / "memory.oom_control"
                oom = _read_counter(ctl, "oom_kill") + _read_counter(ctl, "under_oom")
        if self.pids_dir is not None:
            pids = _read_counter(self.pids_dir / "pids.events", "max")
        return oom, pids

    def memory_used(self) -> int:
        """Bytes charged to this sandbox now (its processes and its tmpfs); 0 if unknown."""
        if self.mem_dir is None:
            return 0
        name = "memory.usage_in_bytes" if self.version == 1 else "memory.current"
        return _read_int(self.mem_dir / name)

    def tasks(self) -> int:
        """Processes + threads in this sandbox now; 0 if unknown."""
        return _read_int(self.pids_dir / "pids.current") if self.pids_dir is not None else 0

    def kill(self) -> None:
        if self.version == 2 and self.dirs and _write(self.dirs[0] / "cgroup.kill", "1"):
            return
        for d in self.dirs:
            with contextlib.suppress(OSError, ValueError):
                for pid in (d / "cgroup.procs").read_text().split():
                    with contextlib.suppress(ProcessLookupError, PermissionError):
                        os.kill(int(pid), signal.SIGKILL)

    def empty(self) -> bool:
        for d in self.dirs:
            with contextlib.suppress(OSError):
                if (d / "cgroup.procs").read_text().strip():
                    return False
        return True

    def remove(self, wait_s: float = 2.0) -> bool:
        """Kill what is left and remove the directories (blocking; call from a thread)."""
        deadline = time.monotonic() + wait_s
        while True:
            self.kill()
            left = []
            for d in self.dirs:
                try:
                    d.rmdir()
                except FileNotFoundError:
                    pass
                except OSError:
                    left.append(d)
            self.dirs = left
            if not left:
                return True
            if time.monotonic() > deadline:
                log.warning("could not remove cgroups %s", [str(d) for d in left])
                return False
            time.sleep(0.02)


class CgroupRoot:
    """A parent cgroup `agentrl-sandbox-<pid>` under which each worker gets a child."""

    def __init__(
        self,
        version: int,
        mem_parent: Path | None,
        pids_parent: Path | None,
        cpu_parent: Path | None = None,
    ) -> None:
        self.version = version
        self.mem_parent = mem_parent
        self.pids_parent = pids_parent
        self.cpu_parent = cpu_parent  # v1: the cpuacct hierarchy; v2: cpu.stat is everywhere

    @property
    def controllers(self) -> list[str]:
        named = (("memory", self.mem_parent), ("pids", self.pids_parent), ("cpu", self.cpu_parent))
        return [n for n, p in named if p]

    @classmethod
    def detect(cls, name: str | None = None) -> CgroupRoot | None:
        name = name or f"agentrl-sandbox-{os.getpid()}"
        own = _own_paths()
        mounts = _mounts()
        v1 = {}
        for mnt, fstype, opts in mounts:
            for c in ("memory", "pids", "cpuacct"):
                if fstype == "cgroup" and c in opts and c not in v1:
                    v1[c] = _make(_base(mnt, own.get(c)) / name)
        for parent in v1.values():
            if parent is not None:
                _remove_stale(parent.parent)
        if v1.get("memory") or v1.get("pids"):
            return cls(1, v1.get("memory"), v1.get("pids"), v1.get("cpuacct"))
        for mnt, fstype, _ in mounts:
            if fstype == "cgroup2":
                root = _v2_parent(_base(mnt, own.get("")), name)
                if root is not None:
                    return root
        return None

    def create(self, leaf: str, memory_bytes: int, pids: int) -> Cgroup:
        if self.version == 2:
            d = self.mem_parent or self.pids_parent
            assert d is not None
            d = d / leaf
            d.mkdir()
            cg = Cgroup(2, [d], d if self.mem_parent else None, d if self.pids_parent else None)
            cg.cpu_dir = d
            _write(d / "memory.max", str(memory_bytes))
            _write(d / "memory.swap.max", "0")
            _write(d / "pids.max", str(pids))
            cg.procs_files = [str(d / "cgroup.procs")]
            return cg
        cg = Cgroup(1, [], None, None)
        if self.mem_parent:
            d = self.mem_parent / leaf
            d.mkdir()
            cg.dirs.append(d)
            cg.mem_dir = d
            _write(d / "memory.limit_in_bytes", str(memory_bytes))
            _write(d / "memory.memsw.limit_in_bytes", str(memory_bytes))
        if self.pids_parent:
            d = self.pids_parent / leaf
            d.mkdir()
            cg.dirs.append(d)
            cg.pids_dir = d
            _write(d / "pids.max", str(pids))
        if self.cpu_parent:
            d = self.cpu_parent / leaf
            d.mkdir()
            cg.dirs.append(d)
            cg.cpu_dir = d
        cg.procs_files = [str(d / "cgroup.procs") for d in cg.dirs]
        return cg

    def limit_total(self, memory_bytes: int, pids: int) -> bool:
        """Cap the memory and tasks of all sandboxes together (the parent's limits bound the
        children's sum). True when every available controller took its limit."""
        ok = True
        if self.mem_parent is not None:
            if self.version == 1:
                _write(self.mem_parent / "memory.use_hierarchy", "1")
                ok &= _write(self.mem_parent / "memory.limit_in_bytes", str(memory_bytes))
            else:
                ok &= _write(self.mem_parent / "memory.max", str(memory_bytes))
        if self.pids_parent is not None:
            ok &= _write(self.pids_parent / "pids.max", str(pids))
        return ok

    def memory_used(self) -> int | None:
        """Bytes all sandboxes hold now, the page cache the kernel can drop at once aside (the
        working set, as kubelet counts it: usage - inactive_file). Their usage counts every file
        they read until the kernel reclaims it at the limit: a red-team pass read 480 MB of
        files in sandboxes that then ended, and the service refused every call as over its
        memory cap. None without the memory controller."""
        if self.mem_parent is None:
            return None
        name = "memory.usage_in_bytes" if self.version == 1 else "memory.current"
        key = "total_inactive_file" if self.version == 1 else "inactive_file"
        try:
            used = int((self.mem_parent / name).read_text())
            stat = (self.mem_parent / "memory.stat").read_text().split()
        except (OSError, ValueError):
            return None
        stats = dict(zip(stat[::2], stat[1::2], strict=False))
        return max(used - int(stats.get(key, 0)), 0)

    def tasks_used(self) -> int | None:
        """Processes + threads of all sandboxes now (None without the pids controller)."""
        if self.pids_parent is None:
            return None
        return _read_int(self.pids_parent / "pids.current")

    def remove(self) -> None:
        for d in {self.mem_parent, self.pids_parent, self.cpu_parent} - {None}:
            with contextlib.suppress(OSError):
                d.rmdir()  # type: ignore[union-attr]


def _remove_stale(base: Path) -> None:
    """Remove `agentrl-sandbox-<pid>` cgroups left by services that died without cleaning up."""
    for d in base.glob("agentrl-sandbox-*"):
        pid = d.name.rsplit("-", 1)[-1]
        if not pid.isdigit() or Path(f"/proc/{pid}").exists():
            continue
        for leaf in [p for p in d.iterdir() if p.is_dir()] + [d]:
            with contextlib.suppress(OSError):
                leaf.rmdir()


def _make(path: Path) -> Path | None:
    try:
        path.mkdir(exist_ok=True)
        return path
    except OSError:
        return None


def _v2_parent(base: Path, name: str) -> CgroupRoot | None:
    """v2 needs memory+pids enabled for our children; fails (None) without delegation."""
    try:
        avail = (base / "cgroup.controllers").read_text().split()
    except OSError:
        return None
    if "memory" not in avail and "pids" not in avail:
        return None
    parent = _make(base / name)
    if parent is None:
        return None
    want = [c for c in ("memory", "pids") if c in avail]
    _write(base / "cgroup.subtree_control", " ".join(f"+{c}" for c in want))
    _write(parent / "cgroup.subtree_control", " ".join(f"+{c}" for c in want))
    have = (parent / "cgroup.subtree_control").read_text().split()
    if not have:
        with contextlib.suppress(OSError):
            parent.rmdir()
        return None
    mem, pids = (parent if c in have else None for c in ("memory", "pids"))
    return CgroupRoot(2, mem, pids, parent)
