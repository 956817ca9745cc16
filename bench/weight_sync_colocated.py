"""Colocated weight sync on one GPU (or --tp N: N GPUs, N learner ranks, one SGLang server at tp=N):
agentrl's `weight_sync.method=tensor` (FSDP2 learner on Ray →
SGLang on the same GPU, CUDA IPC, one flattened bucket per request) against the naive reference,
the whole model as per-tensor CUDA-IPC handles in one `/update_weights_from_tensor` request, sent
by a process that already holds the bf16 weights on the GPU. Both push into the same server in
the same run.

    python bench/weight_sync_colocated.py --shape 0.5b [--bucket-mb 256 1024] [--repeats 5]
    python bench/weight_sync_colocated.py --shape 1.5b --url http://127.0.0.1:30000 --model DIR
    python bench/weight_sync_colocated.py --shape 1.5b --tp 2 --formats direct   # two GPUs

`--formats`: SGLang load formats of the tensor method (`direct`: fused names copied straight
into the parameters; `flattened_bucket`: the model's load_weights). Shapes are Qwen2.5's (random weights, built here: no hub download). Prints seconds per push and
seconds per billion parameters for each bucket size and for the reference, and the ratio
agentrl / reference (below 1: faster than the naive update). The server is started with
`--enable-memory-saver` and each agentrl push runs as in training: release the engine's memory,
resume its weights, push, resume the KV cache (release/resume are timed apart). Needs SGLang on
the GPU host (`source /tmp/site/sgl_env.sh`).

`--offload all|optimizer|none` is `learner.offload` (default all: the learner's whole state leaves
the GPU while SGLang samples). The hand-over printed per row is what a colocated step adds to the
update: release + onload (and the engine's weights resumed), push, offload + resume. Its floor, measured in the same run: the same
bytes as the learner state moved (per rank) copied once each way between pinned host memory and
the GPU (`copy floor`).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path

import torch
from learner_microbatch import make_batch  # bench/: the learner bench's synthetic batch

from agentrl.assets.build import QWEN25_SHAPES, build_random_qwen25
from agentrl.engine import EngineClient, EngineConfig, launch_engines
from agentrl.learner import LearnerConfig, RayConfig
from agentrl.learner.group import LearnerGroup
from agentrl.learner.ray_start import start_ray, stop_ray
from agentrl.loss import LossConfig
from agentrl.weight_sync import WeightSyncConfig, make_weight_sync

SGLANG_ARGS = ["--attention-backend", "triton", "--enable-memory-saver", "--grammar-backend",
               "none", "--sampling-backend", "pytorch", "--mm-feature-transport", "cpu",
               "--dtype", "bfloat16"]  # fmt: skip


async def naive_push(
    engine: EngineClient, named: list[tuple[str, torch.Tensor]], v: str, tp: int = 1
) -> float:
    """The reference: every tensor its own CUDA-IPC handle, all in one request (the same full
    tensors for every TP rank, whose loader cuts its slices)."""
    from sglang.srt.utils import MultiprocessingSerializer
    from sglang.srt.utils.patch_torch import monkey_patch_torch_reductions

    monkey_patch_torch_reductions()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    payload = MultiprocessingSerializer.serialize(named, output_str=True)
    await engine.control.update_weights_from_tensor(
        [payload] * tp, weight_version=v, flush_cache=True
    )
    return time.perf_counter() - t0


def copy_floor(gib: float, repeats: int) -> dict:
    """The hand-over's floor: `gib` (the learner state one rank moves) copied GPU -> pinned host
    -> GPU once each way, as fast as this machine's link goes (median of `repeats`)."""
    n = int(gib * 2**30) // 4
    if n <= 0:
        return {"method": "copy floor (nothing moves)", "buckets": 0, "s": 0.0, "handover_s": 0.0}
    dev, host = torch.empty(n, device="cuda"), torch.empty(n, pin_memory=True)
    times = []
    for _ in range(repeats + 1):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        host.copy_(dev, non_blocking=True)
        torch.cuda.synchronize()
        t1 = time.perf_counter()
        dev.copy_(host, non_blocking=True)
        torch.cuda.synchronize()
        times.append((t1 - t0, time.perf_counter() - t1))
    d2h, h2d = (statistics.median(t[i] for t in times[1:]) for i in (0, 1))
    del dev, host
    torch.cuda.empty_cache()
    return {
        "method": f"copy floor: {gib:.1f} GiB out {d2h:.3f} s, in {h2d:.3f} s",
        "buckets": 0,
        "s": 0.0,
        "handover_s": d2h + h2d,
        "release_onload_s": h2d,
        "offload_resume_kv_s": d2h,
    }


async def measure(args: argparse.Namespace, policy, engine, fmt: str, bucket_mb: float) -> dict:
    """One row: `args.repeats` colocated hand-overs (after a warm-up) with one sync setting."""
    wcfg = WeightSyncConfig(method="tensor", bucket_mb=bucket_mb, load_format=fmt,
                            ranks_per_server=args.tp)  # fmt: skip
    sync = make_weight_sync(wcfg, policy, engine)
    await sync.setup()
    times, rel, res, split, parts = [], [], [], [], []
    for i in range(args.repeats + 1):  # the first push warms up
        t0 = time.perf_counter()
        await engine.control.release_memory_occupation()
        policy.onload()
        await engine.control.resume_memory_occupation(["weights"])
        t2 = time.perf_counter()
        metrics = await sync.push(f"{fmt}-{bucket_mb}-{i}")
        assert metrics.get("sync/direct", 0.0) == float(fmt == "direct"), metrics
        t3 = time.perf_counter()
        policy.offload()
        await engine.control.resume_memory_occupation(["kv_cache", "cuda_graph"])
        t4 = time.perf_counter()
        if i:
            times.append(metrics["sync/seconds"])  # the push's own clock (t3 - t2 less its metrics)
            split.append((metrics["sync/learner_s"], metrics["sync/engine_s"]))
            parts.append(
                {
                    k.removeprefix("sync/learner_").removesuffix("_s"): v
                    for k, v in metrics.items()
                    if k.startswith("sync/learner_") and k != "sync/learner_s"
                }
            )
            rel.append(t2 - t0)  # release, onload, the engine's weights back
            res.append(t4 - t3)
    return {"method": f"agentrl {fmt}, {bucket_mb:g} MB buckets", "params": sync.total_params,
            "handover_s": statistics.median(
                a + b + c for a, b, c in zip(rel, times, res, strict=True)),
            "buckets": len(sync.buckets), "s": statistics.median(times),
            "release_onload_s": statistics.median(rel),
            "learner_s": statistics.median(x for x, _ in split),
            "engine_s": statistics.median(y for _, y in split),
            "offload_resume_kv_s": statistics.median(res),
            "learner_parts": {k: statistics.median(p[k] for p in parts)
                              for k in parts[0]}}  # fmt: skip


async def run(args: argparse.Namespace, url: str, model: Path) -> list[dict]:
    rows: list[dict] = []
    lcfg = LearnerConfig(model_path=str(model), device="cuda", num_workers=args.tp,
                         offload=args.offload)  # fmt: skip
    policy = LearnerGroup(lcfg)
    policy.onload()
    batch = make_batch(episodes=8 * args.tp, length=256, vocab=32000)
    moved_gib, n_params = 0.0, None
    try:
        async with EngineClient([url], timeout_s=600) as engine:
            for trained in [False, True] if args.untrained_too else [True]:
                if trained:  # one optimizer step first, so the Adam moments exist and move
                    policy.onload()
                    policy.train_step(policy.micro_batches(batch), "ppo_clip",
                                      LossConfig(name="ppo_clip"))  # fmt: skip
                before = policy.memory_stats()
                policy.offload()
                # what the offload moved, per rank (the floor copies as much)
                moved_gib = max(
                    b["allocated_gib"] - a["allocated_gib"]
                    for b, a in zip(before, policy.memory_stats(), strict=True)
                )
                for fmt, bucket_mb in [(f, b) for f in args.formats for b in args.bucket_mb]:
                    row = await measure(args, policy, engine, fmt, bucket_mb)
                    row["method"] += "" if trained else " (untrained)"
                    n_params = row.pop("params")
                    rows.append(row)
            # the reference holds its own bf16 copy on the GPU (learner offloaded)
            from transformers import AutoModelForCausalLM

            ref = AutoModelForCausalLM.from_pretrained(model, dtype=torch.bfloat16).cuda()
            named = [(n, p.detach()) for n, p in ref.named_parameters()]
            times = [await naive_push(engine, named, f"naive-{i}", args.tp)
                     for i in range(args.repeats + 1)]  # fmt: skip
            rows.append({"method": "naive: one request, per-tensor IPC", "buckets": 1,
                         "s": statistics.median(times[1:])})  # fmt: skip
            del ref, named
            rows.append(copy_floor(moved_gib, args.repeats))
            for r in rows:
                r["s_per_bparam"] = r["s"] / (n_params / 1e9)
                r["params_b"] = n_params / 1e9
    finally:
        policy.shutdown()
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--shape", choices=sorted(QWEN25_SHAPES), default="0.5b")
    p.add_argument("--model", help="an existing model dir (default: build a random one)")
    p.add_argument("--url", help="a running SGLang server started with --enable-memory-saver")
    p.add_argument("--bucket-mb", type=float, nargs="+", default=[256.0, 1024.0])
    p.add_argument("--formats", nargs="+", default=["direct", "flattened_bucket"])
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--mem-fraction", default="0.3", help="--mem-fraction-static of the server")
    p.add_argument(
        "--untrained-too",
        action="store_true",
        help="also measure before the learner's first optimizer step",
    )
    p.add_argument("--tp", type=int, default=1, help="GPUs: learner ranks and the server's TP size")
    p.add_argument(
        "--offload",
        choices=["all", "optimizer", "none"],
        default="all",
        help="learner.offload: what leaves the GPU while SGLang samples",
    )
    args = p.parse_args()
    with ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="agentrl-wsync-")))
        t0 = time.perf_counter()
        model = Path(args.model) if args.model else build_random_qwen25(tmp / "model", args.shape)
        print(f"model {model} ready in {time.perf_counter() - t0:.1f}s", flush=True)
        url = args.url
        if not url:
            cfg = EngineConfig(kind="sglang", tp=args.tp, extra_args=[
                *SGLANG_ARGS, "--mem-fraction-static", args.mem_fraction])  # fmt: skip
            t0 = time.perf_counter()
            url = stack.enter_context(launch_engines(cfg, model, tmp / "logs"))[0]
            print(f"SGLang up in {time.perf_counter() - t0:.0f}s", flush=True)
        start_ray(RayConfig(object_store_mb=1024))
        stack.callback(stop_ray)
        rows = asyncio.run(run(args, url, model))
    print(f"\nshape {args.shape}: {rows[0]['params_b']:.3f}B parameters, bf16, {args.tp} GPU(s), "
          f"server tp={args.tp} ({torch.cuda.get_device_name()})")  # fmt: skip
    print(f"{'method':<42} {'buckets':>7} {'s/push':>8} {'s/Bparam':>9} {'release+onload s':>17} "
          f"{'offload+resume s':>17} {'learner s':>9} {'engine s':>9} {'hand-over s':>11}")  # fmt: skip
    for r in rows:
        print(f"{r['method']:<42} {r['buckets']:>7d} {r['s']:>8.4f} {r['s_per_bparam']:>9.4f} "
              f"{r.get('release_onload_s', float('nan')):>17.3f} "
              f"{r.get('offload_resume_kv_s', float('nan')):>17.3f} "
              f"{r.get('learner_s', float('nan')):>9.4f} {r.get('engine_s', float('nan')):>9.4f} "
              f"{r.get('handover_s', float('nan')):>11.3f}")  # fmt: skip
        if r.get("learner_parts"):
            print("    learner s by part: " + ", ".join(
                f"{k} {v:.4f}" for k, v in r["learner_parts"].items()))  # fmt: skip
    floor, naive = rows[-1], rows[-2]["s_per_bparam"]
    best = min(rows[:-2], key=lambda r: r["s_per_bparam"])
    print(
        f"best agentrl {best['s_per_bparam']:.4f} s/B ({best['method']}); "
        f"ratio agentrl/naive {best['s_per_bparam'] / naive:.2f} (goal <= 0.02 s/B)"
    )
    print(
        f"hand-over (offload={args.offload}) {best['handover_s']:.3f} s against its copy floor "
        f"{floor['handover_s']:.3f} s: {best['handover_s'] / max(floor['handover_s'], 1e-9):.2f}x "
        "(goal < 1.5 s at 1.5B with offload=all)"
    )


if __name__ == "__main__":
    main()
