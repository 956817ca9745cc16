"""Offline install for air-gapped GPU hosts: build a wheelhouse where there is network, install from it
where there is none.

On a machine with network (any OS/arch; wheels are chosen for the target):

    python -m agentrl.wheelhouse download wheels/ --python-version 3.12 --gpu
    tar czf agentrl-wheels.tgz wheels/

On the GPU host (no network; its own CUDA torch stays as it is):

    tar xzf agentrl-wheels.tgz
    python -m pip install --no-index --find-links wheels/ -r wheels/requirements.txt
    python -m pip install --no-index --no-deps wheels/agentrl-*.whl

`download` writes `requirements.txt` (our pinned dependencies WITHOUT torch, plus sglang with
--gpu), fetches every wheel as a binary for the target Python and platform, and builds agentrl's own
wheel. torch is left out on purpose: GPU hosts bring a CUDA build that matches their driver, and
SGLang must match that torch (SGLang >= 0.5.17; see docs/gpu.md).
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PLATFORMS = ["manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64"]
# pure-Python dependencies published only as source: built into wheels here (they run anywhere)
SDIST_ONLY = ["antlr4-python3-runtime==4.9.3"]


def requirements(gpu: bool, extras: list[str]) -> list[str]:
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    reqs = [r for r in meta["dependencies"] if re.split(r"[=<>!~ ;\[]", r)[0] != "torch"]
    for extra in (["gpu"] if gpu else []) + extras:
        reqs += meta["optional-dependencies"][extra]
    return reqs


def download(out: Path, python_version: str, platforms: list[str], gpu: bool, extras: list[str]):
    out.mkdir(parents=True, exist_ok=True)
    reqs = requirements(gpu, extras)
    (out / "requirements.txt").write_text("\n".join(reqs) + "\n")
    pip = [sys.executable, "-m", "pip"]
    subprocess.run([*pip, "wheel", "--no-deps", "-w", str(out), *SDIST_ONLY], check=True)
    cmd = [*pip, "download", "--only-binary=:all:", "-d", str(out), "--find-links", str(out),
           "--python-version", python_version, "-r", str(out / "requirements.txt")]  # fmt: skip
    for p in platforms:
        cmd += ["--platform", p]
    subprocess.run(cmd, check=True)
    subprocess.run([*pip, "wheel", "--no-deps", "-w", str(out), str(ROOT)], check=True)
    print(f"wheelhouse ready: {out} ({len(list(out.glob('*.whl')))} wheels)")


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m agentrl.wheelhouse", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    sub = p.add_subparsers(dest="cmd", required=True)
    d = sub.add_parser("download", help="fetch wheels for an offline host")
    d.add_argument("out", type=Path)
    d.add_argument("--python-version", default="3.12")
    d.add_argument("--platform", action="append", default=None, help=f"default: {PLATFORMS}")
    d.add_argument("--gpu", action="store_true", help="include SGLang (the [gpu] extra)")
    d.add_argument("--extra", action="append", default=[], help="more extras, e.g. e2b")
    r = sub.add_parser("requirements", help="print the requirements a wheelhouse would hold")
    r.add_argument("--gpu", action="store_true")
    a = p.parse_args(argv)
    if a.cmd == "requirements":
        print("\n".join(requirements(a.gpu, [])))
    else:
        download(a.out, a.python_version, a.platform or PLATFORMS, a.gpu, a.extra)


if __name__ == "__main__":
    main()
