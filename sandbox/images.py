"""Sandbox images: a root filesystem a session runs in, written through a throw-away overlay.

    from agentrl.sandbox.images import build_image
    root = build_image(["python3.11-minimal", "libpython3.11-stdlib", "bash", "coreutils"])
    ServerConfig(images={"py": str(root)})                 # then run(..., image="py")

An image is a directory holding a root filesystem (or a .tar/.tar.gz of one, unpacked once into
the cache by content). A session or one-shot call that names an image (`ExecService.run(image=)`,
`ServiceSandbox.use_image(session, image)`) gets a bwrap worker whose `/` is an overlay: the
image, read-only, under an invisible tmpfs that takes every write and is gone with the worker.
Everything else is the host-view sandbox's (sandbox/isolation.py): namespaces (user, pid, net,
mount, ipc, uts), the per-worker uid, cgroups, seccomp, rlimits, a private size-limited /tmp and
/dev/shm, a clean environment. Nothing of the host is mounted: not /usr, not the interpreter the
service runs (the image's own `python3` runs the in-sandbox agent, which needs the standard
library only). Images need bwrap mode; rlimits mode refuses them by name.

`build_image` makes one offline from Debian packages installed on this host (each package's files
as dpkg lists them, with its installed dependencies) and wheels (unpacked into the image's
dist-packages), cached under $AGENTRL_CACHE/images/<sha256 of the package versions and wheel
contents>, so the same inputs give the same image, built once.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import subprocess
import tarfile
import tempfile
import zipfile
from collections.abc import Callable
from pathlib import Path

from agentrl.sandbox.isolation import Interp, Launcher

BUILDER_VERSION = 2  # a change to what is built changes every image's hash


def cache_root() -> Path:
    return Path(os.environ.get("AGENTRL_CACHE", Path.home() / ".cache" / "agentrl")) / "images"


def resolve(path: str) -> Path:
    """An image given as a directory, or a tarball unpacked once into the cache by content."""
    p = Path(path).expanduser()
    if p.is_dir():
        return p.resolve()
    if not p.is_file():
        raise FileNotFoundError(f"image {path}: no such directory or tarball")
    digest = hashlib.sha256(p.read_bytes()).hexdigest()[:20]

    def unpack(root: Path) -> None:
        with tarfile.open(p) as t:
            t.extractall(root, filter="tar")  # a root filesystem: links may point anywhere

    return made_once(cache_root() / f"tar-{digest}", unpack)


def made_once(dest: Path, make: Callable[[Path], None]) -> Path:
    """`dest`, made by `make(dir)` in a temporary directory beside it and renamed into place
    whole, so a cached image is never half-made (another process that finished first keeps
    its copy; this one's is removed)."""
    if dest.is_dir():
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=dest.parent, prefix=".build-"))
    try:
        make(tmp / "root")
        with contextlib.suppress(OSError):  # there already: made by another process
            os.rename(tmp / "root", dest)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return dest


MOUNT_POINTS = ("etc/passwd", "etc/group", "tmp", "proc", "dev")


def check_root(root: Path) -> None:
    """The paths a worker mounts over must exist in the image: an unprivileged worker cannot
    create them in a root filesystem it does not own."""
    missing = [p for p in MOUNT_POINTS if not (root / p).exists()]
    if missing:
        raise FileNotFoundError(f"image {root}: lacks {missing} (create them in the image)")


def image_python(root: Path) -> str:
    """The image's interpreter, as a path inside it."""
    for name in ("python3", "python3.13", "python3.12", "python3.11", "python3.10", "python3.9"):
        for d in ("usr/bin", "usr/local/bin", "bin"):
            if (root / d / name).exists() or (root / d / name).is_symlink():
                return f"/{d}/{name}"
    raise FileNotFoundError(f"image {root}: no python3 in /usr/bin, /usr/local/bin or /bin")


def site_paths(root: Path) -> list[str]:
    """The image's package directories (the agent runs `python -I -S`: it adds them itself)."""
    found = sorted(
        str(p.relative_to(root)) for p in root.glob("usr/local/lib/python3*/dist-packages")
    )
    found += (
        ["usr/lib/python3/dist-packages"]
        if (root / "usr/lib/python3/dist-packages").is_dir()
        else []
    )
    return ["/" + p for p in found]


class ImageLauncher(Launcher):
    """Workers whose root is `root` under an overlay (bwrap only)."""

    def __init__(self, cfg, workdir: Path, root: Path) -> None:  # type: ignore[no-untyped-def]
        self.image_root = root
        check_root(root)
        interp = Interp(executable=image_python(root), prefixes=[], site_paths=site_paths(root))
        super().__init__(cfg.model_copy(update={"ro_paths": []}), workdir, interp, "bwrap")

    def env(self, home: str) -> dict[str, str]:
        env = super().env(home)
        env["PATH"] = "/usr/local/bin:/usr/bin:/bin"
        if not (self.image_root / "usr/lib/locale/C.utf8").exists():  # no locale data: plain C
            env["LANG"] = env["LC_ALL"] = "C"  # (Python then reads and writes UTF-8 anyway)
        return env

    def _root_argv(self) -> list[str]:
        # a root under a directory the per-worker uid may not enter (~root/.cache): staged, as
        # the host view's interpreter is (the worker's preexec bind-mounts it there)
        return ["--overlay-src", self._stage_if_needed(str(self.image_root)), "--tmp-overlay", "/"]

    def _after_tmp_argv(self) -> list[str]:
        return ["--remount-ro", "/dev"]  # the root stays writable: its writes are the overlay's


# -- the builder -------------------------------------------------------------------------------


def _dpkg(*args: str) -> str:
    try:
        res = subprocess.run(["dpkg-query", *args], capture_output=True, text=True)
    except FileNotFoundError as e:
        raise RuntimeError("build_image reads Debian packages with dpkg-query: not found") from e
    return res.stdout if res.returncode == 0 else ""


def _installed() -> dict[str, tuple[str, str]]:
    """Every package dpkg has installed: its name -> (its version, its Depends and Pre-Depends),
    from one dpkg-query call (three calls a package took 1.6 s for python3, bash and coreutils)."""
    out = _dpkg("-W", "-f=${Package}\t${Status}\t${Version}\t${Depends},${Pre-Depends}\n")
    found: dict[str, tuple[str, str]] = {}
    for line in out.splitlines():
        name, status, version, deps = line.split("\t", 3)
        if status.endswith(" installed"):
            found.setdefault(name, (version, deps))  # a package of several architectures: once
    return found


def package_closure(packages: list[str]) -> dict[str, str]:
    """`packages` and every package they depend on (the first installed alternative of each
    dependency), with their installed versions. A requested package that is not installed
    raises, naming it."""
    installed = _installed()
    missing = [p for p in packages if p not in installed]
    if missing:
        raise RuntimeError(f"build_image: not installed on this host: {missing} (apt install them)")
    seen: dict[str, str] = {}
    todo = list(packages)
    while todo:
        pkg = todo.pop()
        if pkg in seen or pkg not in installed:
            continue
        seen[pkg], deps = installed[pkg]
        for alt in filter(None, (d.strip() for d in deps.split(","))):
            names = [a.strip().split(" ")[0].split(":")[0] for a in alt.split("|")]
            todo.append(next((n for n in names if n in installed), names[0]))
    return dict(sorted(seen.items()))


def _copy(src: str, root: Path) -> None:
    # through the host's merged-/usr links (/lib64 -> usr/lib64): into the real directories
    real = os.path.join(os.path.realpath(os.path.dirname(src)), os.path.basename(src))
    dest = root / real.lstrip("/")
    if os.path.islink(src):
        dest.parent.mkdir(parents=True, exist_ok=True)
        if not dest.is_symlink() and not dest.exists():
            os.symlink(os.readlink(src), dest)
    elif os.path.isdir(src):
        dest.mkdir(parents=True, exist_ok=True)
    elif os.path.isfile(src):
        dest.parent.mkdir(parents=True, exist_ok=True)
        if not dest.exists():
            shutil.copy2(src, dest)


def build_image(
    packages: list[str], wheels: list[str] | None = None, name: str | None = None
) -> Path:
    """A root filesystem of these Debian packages (and their dependencies, as installed here)
    and wheels; built once per content (see the module docstring)."""
    closure = package_closure(packages)
    wheel_hashes = {Path(w).name: hashlib.sha256(Path(w).read_bytes()).hexdigest()
                    for w in wheels or []}  # fmt: skip
    spec = {"v": BUILDER_VERSION, "packages": closure, "wheels": wheel_hashes}
    digest = hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:20]

    def make(root: Path) -> None:
        for d in ("usr/bin", "usr/lib", "etc", "tmp", "proc", "dev", "root"):
            (root / d).mkdir(parents=True, exist_ok=True)
        for f in ("etc/passwd", "etc/group"):  # mount points the sandbox binds its own over
            (root / f).touch()
        for d in ("bin", "sbin", "lib", "lib64"):  # merged /usr, as Debian 12 lays it out
            if os.path.islink(f"/{d}"):
                os.symlink(os.readlink(f"/{d}"), root / d)
        for pkg in closure:
            for path in _dpkg("-L", pkg).splitlines():
                if path.startswith("/") and not path.startswith(("/proc", "/dev", "/sys")):
                    _copy(path, root)
        py = image_python(root)
        for alias in ("python3", "python"):  # what agents type (python-is-python3)
            link = root / "usr" / "bin" / alias
            if not link.exists() and not link.is_symlink():
                os.symlink(os.path.basename(py), link)
        if wheels:
            site = root / "usr" / "lib" / "python3" / "dist-packages"
            site.mkdir(parents=True, exist_ok=True)
            for w in wheels:
                with zipfile.ZipFile(w) as z:
                    z.extractall(site)
        (root / ".agentrl-image.json").write_text(json.dumps({**spec, "python": py}, indent=1))

    return made_once(cache_root() / f"{name or 'deb'}-{digest}", make)
