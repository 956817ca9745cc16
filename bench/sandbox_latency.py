"""Sandbox service latency and throughput for short snippets, against a bare-subprocess reference.

    python bench/sandbox_latency.py                       # starts a local service on loopback
    python bench/sandbox_latency.py --url http://127.0.0.1:8470 --n 400 --concurrency 1,8,32
    python bench/sandbox_latency.py --under-attack        # an innocent session vs each attack

For each concurrency c it runs `n` short snippets with c callers in flight and prints p50/p99
latency and executions per second for: one-shot calls (a fresh isolated sandbox each), calls in
c sessions (one interpreter per session), and the reference measured in the same run: a bare
`python -I -c <snippet>` subprocess per snippet (no isolation, no service). Ratios are ours
divided by the reference's (exec/s: higher is better; p50: lower is better). Also per call: the
machine's CPU (user and kernel, from /proc/stat, over the calls and the pool's refill after them),
what a call costs the box whoever spends it (the service, its short-lived workers, the kernel).

`--under-attack`: one innocent session makes `n` calls in a row (`x += 1; x`) while one class of
attack runs without pause against the same service (each attack call re-issued as soon as it
ends); it prints the innocent calls' p50/p99, how many failed, and the p50 ratio to the same
session with no attack, measured in the same run. `memory_cap_fill` and `process_cap_fill` hold
past 90 % of the service's caps (2048 MB and 1024 tasks here) and fill again once evicted;
`sleepers_70` keeps 70 calls asleep. `--attacks a,b` runs a subset.

`--images`: sessions from an image (sandbox/images.py: python3.11 + bash + coreutils built from
this host's Debian packages). Two services, measured in the same run: one with no warm image
workers (every session start is cold: a bwrap worker on the image's overlay, its interpreter
started) and one with a warm pool of `--warm-workers` per image; for each, `n` session starts
(first call `pass`, p50/p99), one-shot image calls per second at each concurrency, and the
memory of `--idle` idle image sessions (the sandboxes' cgroup, per session). The reference is
the host-view sandbox's session start in the warm service, so the ratio is the cost of the image.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import statistics
import sys
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from agentrl.sandbox import ServerConfig, ServiceSandbox  # noqa: E402
from agentrl.sandbox.server import LocalService  # noqa: E402

SNIPPET = "print(sum(i * i for i in range(1000)))"
EXPECTED = f"{sum(i * i for i in range(1000))}\n"


async def _drive(n: int, c: int, call) -> tuple[list[float], float]:
    """n calls, c in flight; returns per-call latencies and the wall time."""
    lat: list[float] = []
    todo = iter(range(n))

    async def worker(w: int) -> None:
        for i in todo:
            t0 = time.perf_counter()
            await call(w, i)
            lat.append(time.perf_counter() - t0)

    t0 = time.perf_counter()
    await asyncio.gather(*(worker(w) for w in range(c)))
    return lat, time.perf_counter() - t0


async def reference_call(w: int, i: int) -> None:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-I", "-c", SNIPPET, stdout=asyncio.subprocess.PIPE
    )
    out, _ = await proc.communicate()
    assert out.decode() == EXPECTED


def _row(name: str, c: int, lat: list[float], wall: float) -> dict:
    lat = sorted(lat)
    p99 = lat[min(len(lat) - 1, int(0.99 * len(lat)))]
    return {"mode": name, "c": c, "p50_ms": 1000 * statistics.median(lat), "p99_ms": 1000 * p99,
            "exec_s": len(lat) / wall}  # fmt: skip


def _box_cpu() -> tuple[int, int]:
    """The machine's user and kernel CPU so far, in clock ticks (/proc/stat)."""
    v = [int(x) for x in Path("/proc/stat").read_text().split("\n")[0].split()[1:]]
    return v[0] + v[1], v[2] + v[5] + v[6]


async def bench(url: str, n: int, concurrencies: list[int]) -> list[dict]:
    sb = ServiceSandbox(url, retries=8, max_concurrency=max(concurrencies))

    async def oneshot(w: int, i: int) -> None:
        res = await sb.run(SNIPPET, timeout=30)
        assert res.stdout == EXPECTED, res

    async def session(w: int, i: int) -> None:
        res = await sb.run(SNIPPET, timeout=30, session=f"bench-{w}")
        assert res.stdout == EXPECTED, res

    await _drive(8, 2, oneshot)  # warm-up
    rows = []
    for c in concurrencies:
        for name, call in (
            ("one-shot", oneshot),
            ("session", session),
            ("reference", reference_call),
        ):
            await asyncio.sleep(1.0)  # let the warm pool refill
            (u0, k0), hz = _box_cpu(), os.sysconf("SC_CLK_TCK")
            lat, wall = await _drive(n, c, call)
            await asyncio.sleep(1.0)  # the pool's refill after the calls is their cost too
            u1, k1 = _box_cpu()
            rows.append({**_row(name, c, lat, wall), "user_ms": 1000 * (u1 - u0) / hz / n,
                         "kernel_ms": 1000 * (k1 - k0) / hz / n})  # fmt: skip
        for w in range(c):
            await sb.close_session(f"bench-{w}")
    await sb.aclose()
    return rows


async def image_starts(url: str, n: int, image: str | None) -> list[float]:
    """Latencies of `n` session starts (first call `pass`), one after another."""
    sb = ServiceSandbox(url, retries=8)
    lat = []
    for i in range(n):
        key = f"start-{image}-{i}"
        if image is not None:
            sb.use_image(key, image)
        t0 = time.perf_counter()
        res = await sb.run("pass", session=key, timeout=30)
        lat.append(time.perf_counter() - t0)
        assert res.ok, res
        await sb.close_session(key)
        await asyncio.sleep(0.05)  # the warm pool refills between starts, as between episodes
    await sb.aclose()
    return lat


async def image_idle_mb(url: str, k: int) -> float | None:
    """Memory of the sandboxes per idle image session (cgroup; None where there is none)."""
    sb = ServiceSandbox(url, retries=8)
    async with httpx.AsyncClient() as http:
        before = (await http.get(f"{url}/health")).json()["memory_mb"]
        for i in range(k):
            sb.use_image(f"idle-{i}", "img")
            await sb.run("x = 1", session=f"idle-{i}", timeout=30)
        after = (await http.get(f"{url}/health")).json()["memory_mb"]
    for i in range(k):
        await sb.close_session(f"idle-{i}")
    await sb.aclose()
    return None if before is None else (after["used"] - before["used"]) / k


async def _image_service(url: str, n: int, label: str, warm: bool, conc: list[int],
                         idle: int) -> list[dict]:  # fmt: skip
    starts = await image_starts(url, n, "img")
    rows = [_row(f"image start, {label}", 1, starts, sum(starts))]
    if warm:
        ref = await image_starts(url, n, None)
        rows.append(_row("host-view start (reference)", 1, ref, sum(ref)))
    sb = ServiceSandbox(url, retries=8, max_concurrency=max(conc))

    async def oneshot(_w: int, _i: int) -> None:
        res = await sb.run(SNIPPET, timeout=30, image="img")
        assert res.stdout == EXPECTED, res

    for c in conc:
        lat, wall = await _drive(n, c, oneshot)
        rows.append(_row(f"image one-shot, {label}", c, lat, wall))
    await sb.aclose()
    if warm:
        mb = await image_idle_mb(url, idle)
        print(f"memory per idle image session: {mb if mb is None else round(mb, 1)} MB "
              f"(over {idle} sessions, the sandboxes' cgroup)")  # fmt: skip
    return rows


def images_bench(n: int, warm: int, concurrencies: list[int], idle: int) -> None:
    from agentrl.sandbox.images import build_image

    root = build_image(
        ["python3.11-minimal", "libpython3.11-stdlib", "bash", "coreutils"], name="bench"
    )
    print(f"image {root}")
    rows = []
    for label, w in (("cold", 0), ("warm pool", warm)):
        cfg = ServerConfig(warm_workers=warm, images={"img": str(root)}, image_warm_workers=w)
        with LocalService(cfg) as svc:
            rows += asyncio.run(_image_service(svc.url, n, label, w > 0, concurrencies, idle))
    ref_p50 = next(r["p50_ms"] for r in rows if r["mode"].startswith("host-view"))
    for r in rows:
        ratio = r["p50_ms"] / ref_p50
        print(f"{r['mode']:<34} c={r['c']:<3} p50 {r['p50_ms']:7.1f} ms  p99 {r['p99_ms']:7.1f} ms"
              f"  {r['exec_s']:7.1f}/s  p50 vs host-view start x{ratio:.2f}")  # fmt: skip


def report(rows: list[dict], health: dict) -> None:
    iso = health["isolation"]
    print(f"isolation={iso['mode']} cgroup={iso['cgroup']} seccomp={iso['seccomp']} "
          f"cpus={os.cpu_count()} max_running={health['max_running']} "
          f"warm={health['pool'].get('warm')} mean_spawn_ms={health['pool'].get('mean_spawn_ms')}")  # fmt: skip
    print(f"snippet: {SNIPPET!r}")
    print(f"{'mode':<10} {'conc':>4} {'p50 ms':>8} {'p99 ms':>8} {'exec/s':>8}  "
          f"{'x ref exec/s':>12} {'x ref p50':>9}  {'cpu ms/call: user':>17} {'kernel':>6}")  # fmt: skip
    ref = {r["c"]: r for r in rows if r["mode"] == "reference"}
    for r in rows:
        base = ref[r["c"]]
        print(f"{r['mode']:<10} {r['c']:>4} {r['p50_ms']:>8.1f} {r['p99_ms']:>8.1f} "
              f"{r['exec_s']:>8.1f}  {r['exec_s'] / base['exec_s']:>12.2f} "
              f"{r['p50_ms'] / base['p50_ms']:>9.2f}  {r['user_ms']:>17.1f} "
              f"{r['kernel_ms']:>6.1f}")  # fmt: skip


ATTACKS: dict[str, tuple[int, str, bool]] = {
    # name: (concurrent attackers, code, in a session)
    "sleepers": (4, "import time; time.sleep(30)", True),
    "cpu_spin": (2, "while True: pass", False),
    "fork_bomb": (1, "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n"
                     "        pass", False),
    "thread_bomb": (1, "import threading, time\nwhile True:\n    threading.Thread("
                       "target=time.sleep, args=(60,)).start()", False),
    "memory_hog": (2, "x = []\nwhile True:\n    x.append(b'x' * (16 << 20))", True),
    "output_flood": (2, "while True: print('x' * 65536)", False),
    "huge_frame": (2, "import os, stat\nfd = next(f for f in range(3, 256) if os.path.exists("
                      "f'/proc/self/fd/{f}') and stat.S_ISSOCK(os.fstat(f).st_mode))\n"
                      "os.write(fd, (2**31).to_bytes(4, 'big'))\nwhile True:\n"
                      "    os.write(fd, b'x' * (1 << 20))", False),
    "between_calls_flood": (1, "import sys, threading\ndef f():\n    while True:\n"
                               "        sys.stdout.write('x' * 65536)\n"
                               "threading.Thread(target=f, daemon=True).start()", True),
    "idle_sessions": (64, "hold = b'x' * (8 << 20)  # once, then idle", True),
    # sessions that together hold past 90 % of the service's memory (--service-memory-mb) or
    # process cap (--service-processes), each re-filling as soon as it is evicted
    "memory_cap_fill": (12, "hold = bytearray(200 << 20)  # once, then idle", True),
    "process_cap_fill": (18, "import threading\nev = threading.Event()\nts = [threading.Thread("
                             "target=ev.wait, daemon=True) for _ in range(60)]\n"
                             "[t.start() for t in ts]  # once, then idle", True),
    "sleepers_70": (70, "import time; time.sleep(30)", False),
}  # fmt: skip


async def under_attack(url: str, n: int, only: list[str]) -> list[dict]:
    """Per attack class: the innocent session's latencies (and failures) while it runs."""

    async def innocent(tag: str) -> tuple[list[float], int]:
        sb = ServiceSandbox(url, retries=0)
        key = f"innocent-{tag}"
        lat, failed = [], 0
        with contextlib.suppress(Exception):
            await sb.run("x = 0", session=key, timeout=10)
        for i in range(1, n + 1):
            t0 = time.perf_counter()
            try:
                res = await sb.run("x += 1; x", session=key, timeout=10)
                failed += res.result != str(i)
            except Exception:
                failed += 1
            lat.append(time.perf_counter() - t0)
        await sb.close_session(key)
        await sb.aclose()
        return lat, failed

    async def attacker(code: str, key: str | None, stop: asyncio.Event) -> None:
        sb = ServiceSandbox(url, retries=0)
        try:
            await _attack(sb, code, key, stop)
        finally:  # a cancelled attacker closes its client too
            await sb.aclose()

    async def _attack(sb: ServiceSandbox, code: str, key: str | None, stop: asyncio.Event) -> None:
        once = "once, then idle" in code or "threading" in code  # holds its session, idle
        while not stop.is_set():
            with contextlib.suppress(Exception):
                await sb.run(code, timeout=30, session=key)
                while once and not stop.is_set():  # idle; holds again once it was evicted
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(stop.wait(), 0.5)
                    if not stop.is_set() and not (await sb.run("0", session=key)).ok:
                        break
                if not once and key is not None:
                    await sb.close_session(key)  # the next attack starts a fresh interpreter
            await asyncio.sleep(0.05)
        if key is not None:
            await sb.close_session(key)

    rows = []
    lat, failed = await innocent("reference")
    rows.append({"attack": "none (reference)", "lat": lat, "failed": failed})
    for name, (k, code, in_session) in ATTACKS.items():
        if only and name not in only:
            continue
        stop = asyncio.Event()
        tasks = [
            asyncio.create_task(attacker(code, f"{name}-{j}" if in_session else None, stop))
            for j in range(k)
        ]
        await asyncio.sleep(1.5)  # the attack is under way
        lat, failed = await innocent(name)
        stop.set()
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        rows.append({"attack": name, "lat": lat, "failed": failed})
        await asyncio.sleep(1.0)  # the service cleans up
    return rows


def report_attacks(rows: list[dict], health: dict, n: int) -> None:
    iso = health["isolation"]
    print(f"isolation={iso['mode']} cgroup={iso['cgroup']} seccomp={iso['seccomp']} "
          f"cpus={os.cpu_count()} max_running={health['max_running']} innocent calls={n}")  # fmt: skip
    print(f"{'attack':<22} {'p50 ms':>8} {'p99 ms':>8} {'failed':>7} {'x ref p50':>9}")
    ref = statistics.median(rows[0]["lat"])
    for r in rows:
        lat = sorted(r["lat"])
        p50, p99 = statistics.median(lat), lat[min(len(lat) - 1, int(0.99 * len(lat)))]
        print(f"{r['attack']:<22} {1000 * p50:>8.1f} {1000 * p99:>8.1f} {r['failed']:>7} "
              f"{p50 / ref:>9.2f}")  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--url", default=None, help="an existing service (default: start one)")
    p.add_argument("--n", type=int, default=200, help="snippets per (mode, concurrency)")
    p.add_argument("--concurrency", default="1,4,16")
    p.add_argument("--warm-workers", type=int, default=8)
    p.add_argument("--max-running", type=int, default=None, help="default: the service's")
    p.add_argument("--under-attack", action="store_true", help="innocent latency per attack")
    p.add_argument("--images", action="store_true", help="image sessions: cold, warm pool")
    p.add_argument("--idle", type=int, default=16, help="--images: idle sessions to weigh")
    p.add_argument("--attacks", default="", help=f"comma-separated subset of {list(ATTACKS)}")
    p.add_argument(
        "--service-memory-mb",
        type=int,
        default=2048,
        help="the service's memory cap (the cap-filling attacks are sized for 2048)",
    )
    p.add_argument(
        "--service-processes",
        type=int,
        default=1024,
        help="the service's process cap (the cap-filling attacks are sized for 1024)",
    )
    args = p.parse_args()
    conc = [int(c) for c in args.concurrency.split(",")]
    if args.images:
        images_bench(args.n, args.warm_workers, conc, args.idle)
        return
    cfg = ServerConfig(warm_workers=args.warm_workers, service_memory_mb=args.service_memory_mb,
                       service_processes=args.service_processes)  # fmt: skip
    if args.max_running is not None:
        cfg.max_running = args.max_running
    svc = None if args.url else LocalService(cfg)
    url = args.url or svc.start()
    try:
        if args.under_attack:
            only = [a for a in args.attacks.split(",") if a]
            rows = asyncio.run(under_attack(url, args.n, only))
            report_attacks(rows, httpx.get(f"{url}/health", timeout=10).json(), args.n)
            return
        rows = asyncio.run(bench(url, args.n, conc))
        report(rows, httpx.get(f"{url}/health", timeout=10).json())
    finally:
        if svc is not None:
            svc.stop()


if __name__ == "__main__":
    main()
