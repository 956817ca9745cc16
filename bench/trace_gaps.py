"""Where a profiled update leaves the GPU idle: reads a torch.profiler chrome trace (the
`update_rank0.json.gz` that `learner.profile_step` writes) and prints the span, the GPU's busy
time (the union of its kernels, copies and memsets), the idle time in gaps of at least --min-us,
and which host calls overlap those gaps (CUDA runtime calls and top-level CPU ops, by overlapped
time), so a host-bound update shows what the host was doing while the GPU waited.

    python bench/trace_gaps.py DIR/update_rank0.json.gz [--min-us 20] [--top 25]
"""

from __future__ import annotations

import argparse
import bisect
import gzip
import json
from collections import defaultdict
from pathlib import Path

GPU_CATS = {"kernel", "gpu_memcpy", "gpu_memset"}


def load(path: Path) -> list[dict]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:
        trace = json.load(f)
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    return [e for e in events if e.get("ph") == "X" and "dur" in e]


def merged(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    out: list[tuple[float, float]] = []
    for s, e in sorted(intervals):
        if out and s <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], e))
        else:
            out.append((s, e))
    return out


def top_level(ops: list[dict]) -> list[dict]:
    """CPU ops not inside another CPU op of the same thread."""
    out, ends = [], defaultdict(float)
    for e in sorted(ops, key=lambda e: (e["ts"], -e["dur"])):
        tid = (e.get("pid"), e.get("tid"))
        if e["ts"] >= ends[tid]:
            out.append(e)
            ends[tid] = e["ts"] + e["dur"]
    return out


def overlap_by_name(events: list[dict], gaps: list[tuple[float, float]]) -> dict[str, float]:
    starts = [g[0] for g in gaps]
    out: dict[str, float] = defaultdict(float)
    for e in events:
        s, end = e["ts"], e["ts"] + e["dur"]
        i = max(bisect.bisect_right(starts, s) - 1, 0)
        while i < len(gaps) and gaps[i][0] < end:
            lo, hi = max(s, gaps[i][0]), min(end, gaps[i][1])
            if hi > lo:
                out[e["name"]] += hi - lo
            i += 1
    return out


def analyse(path: Path, min_us: float, top: int) -> None:
    events = load(path)
    gpu = [e for e in events if e.get("cat") in GPU_CATS]
    if not gpu:
        raise SystemExit(f"{path}: no GPU events (a CPU trace?)")
    busy = merged([(e["ts"], e["ts"] + e["dur"]) for e in gpu])
    t0, t1 = busy[0][0], busy[-1][1]
    busy_us = sum(e - s for s, e in busy)
    gaps = [(a[1], b[0]) for a, b in zip(busy, busy[1:], strict=False) if b[0] - a[1] >= min_us]
    gap_us = sum(e - s for s, e in gaps)
    small = (t1 - t0) - busy_us - gap_us
    print(f"{path}: GPU span {(t1 - t0) / 1e6:.3f} s, busy {busy_us / 1e6:.3f} s "
          f"({100 * busy_us / (t1 - t0):.1f} %), idle in {len(gaps)} gaps >= {min_us:g} us "
          f"{gap_us / 1e6:.3f} s, in shorter gaps {small / 1e6:.3f} s")  # fmt: skip
    by_kind = defaultdict(float)
    for e in gpu:
        by_kind[e["cat"]] += e["dur"]
    print("GPU time by kind: " + ", ".join(f"{k} {v / 1e6:.3f} s" for k, v in by_kind.items()))
    if gaps:
        longest = sorted(gaps, key=lambda g: g[0] - g[1])[:5]
        print("longest gaps (ms from span start, length ms): " + ", ".join(
            f"{(s - t0) / 1e3:.1f}+{(e - s) / 1e3:.2f}" for s, e in longest))  # fmt: skip
    runtime = [e for e in events if e.get("cat") == "cuda_runtime"]
    cpu_ops = top_level([e for e in events if e.get("cat") in ("cpu_op", "user_annotation")])
    for title, evs in (("CUDA runtime calls", runtime), ("top-level CPU ops", cpu_ops)):
        table = sorted(overlap_by_name(evs, gaps).items(), key=lambda kv: -kv[1])[:top]
        print(f"\n{title} overlapping the gaps (ms):")
        for name, us in table:
            print(f"  {us / 1e3:9.1f}  {name[:100]}")
    host = defaultdict(lambda: [0, 0.0])
    for e in runtime:
        host[e["name"]][0] += 1
        host[e["name"]][1] += e["dur"]
    print("\nCUDA runtime calls over the whole span (count, ms):")
    for name, (n, us) in sorted(host.items(), key=lambda kv: -kv[1][1])[:top]:
        print(f"  {n:8d} {us / 1e3:9.1f}  {name}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("traces", nargs="+", type=Path)
    p.add_argument("--min-us", type=float, default=20.0, help="shortest gap counted (us)")
    p.add_argument("--top", type=int, default=25)
    a = p.parse_args()
    for path in a.traces:
        analyse(path, a.min_us, a.top)
        print()


if __name__ == "__main__":
    main()
