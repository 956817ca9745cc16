"""Where a server's CPU went: reads py-spy's raw (collapsed) stacks of a process tree and prints,
per process, the seconds spent under a loop function (SGLang's HTTP event loop, its scheduler's
loop), the functions beneath it by inclusive and by self time, and, given the number of requests
served, the milliseconds per request. A turn boundary in lock step costs about one request's
serial time in each process times the episodes, so this says which process a multi-turn
rollout waits on (docs/benchmarks.md, "Rollouts, engines and the router").

Record (py-spy 0.4 on the GPU host; nonblocking, the server's every process, then the client):

    py-spy record -r 200 --nonblocking --subprocesses -f raw -o server.txt -- \\
        python -m sglang.launch_server --model-path DIR --skip-tokenizer-init ... &
    py-spy record -r 200 --nonblocking -f raw -o client.txt -- \\
        python bench/rollout_throughput.py --url URL --model DIR --mode multi --rounds 2
    kill -INT %1

Then:

    python bench/pyspy_summary.py server.txt --rate 200 --requests 5140
    python bench/pyspy_summary.py client.txt --rate 200 --root Rollout._loop
"""

from __future__ import annotations

import argparse
import lzma
import re
from collections import Counter
from pathlib import Path

# the loops whose time is the serving (start-up imports, CUDA graph capture are left out)
ROOTS = ("Runner.run", "Scheduler.event_loop_overlap", "Scheduler.event_loop_normal",
         "DetokenizerManager.event_loop")  # fmt: skip


def read_stacks(path: Path) -> list[tuple[str, list[str], int]]:
    """(process, frames outermost first, samples) per line of a raw py-spy file (.xz read as
    is). A frame keeps its function and file name, not its directory or line."""
    opener = lzma.open if path.suffix == ".xz" else open
    out = []
    with opener(path, "rt") as f:
        for line in f:
            stack, _, n = line.rstrip("\n").rpartition(" ")
            if not n.isdigit():
                continue
            parts = stack.split(";")
            procs = [i for i, p in enumerate(parts) if p.startswith("process ")]
            proc = parts[procs[-1]].split(":", 1)[0] if procs else "process ?"
            frames = [short(p) for p in parts[(procs[-1] + 1 if procs else 0) :]]
            out.append((proc, frames, int(n)))
    return out


def short(frame: str) -> str:
    """`func (dir/file.py:12)` -> `func (file.py)`."""
    return re.sub(r" \((.*?):\d+\)$", lambda m: f" ({m.group(1).rsplit('/', 1)[-1]})", frame)


def under(stacks, root: str) -> dict[str, tuple[int, Counter, Counter]]:
    """Per process: samples under a frame whose name starts with `root`, and the frames below it
    counted inclusively and by self (the innermost frame)."""
    out: dict[str, tuple[int, Counter, Counter]] = {}
    for proc, frames, n in stacks:
        at = next((i for i, f in enumerate(frames) if f.startswith(root + " ")), None)
        if at is None:
            continue
        total, inc, own = out.setdefault(proc, (0, Counter(), Counter()))
        below = frames[at + 1 :]
        for f in set(below):
            inc[f] += n
        if below:
            own[below[-1]] += n
        out[proc] = (total + n, inc, own)
    return out


def report(stacks, roots: tuple[str, ...], rate: float, requests: int, top: int) -> None:
    for root in roots:
        for proc, (total, inc, own) in under(stacks, root).items():
            per = f", {1000 * total / rate / requests:.3f} ms a request" if requests else ""
            print(f"== {proc} under {root}: {total / rate:.2f} s{per}")
            for title, counts in (("inclusive", inc), ("self", own)):
                print(f"   -- {title}")
                for f, n in counts.most_common(top):
                    print(f"   {n / rate:8.2f} s  {f[:120]}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("raw", type=Path, help="py-spy record -f raw output (.txt or .txt.xz)")
    p.add_argument("--rate", type=float, default=100.0, help="py-spy's -r (samples a second)")
    p.add_argument("--requests", type=int, default=0, help="requests served while recorded")
    p.add_argument("--root", action="append", help="loop function(s) to report under "
                   f"(default: {', '.join(ROOTS)})")  # fmt: skip
    p.add_argument("--top", type=int, default=20)
    a = p.parse_args()
    stacks = read_stacks(a.raw)
    if not stacks:
        raise SystemExit(f"{a.raw}: no py-spy raw stacks in it (record with -f raw)")
    print(f"{a.raw}: {sum(n for *_, n in stacks) / a.rate:.1f} s of samples")
    report(stacks, tuple(a.root or ROOTS), a.rate, a.requests, a.top)


if __name__ == "__main__":
    main()
