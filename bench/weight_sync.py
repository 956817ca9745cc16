"""Weight sync cost: learner (FSDP2 on Ray) → rollout servers, `distributed` vs `disk`.

    python bench/weight_sync.py [--model DIR | --hidden-size 256 --layers 4] [--workers 1]
                                [--servers 1] [--bucket-mb 64] [--repeats 3] [--urls URL ...]
    python bench/weight_sync.py --lora-rank 8 --hidden-size 896 --layers 24   # + adapter
    python bench/weight_sync.py --shape 1.5b --engine sglang --device cuda    # two GPUs

--engine sglang starts one SGLang server on the last visible GPU (the learner takes the others'
first, as `engine.colocate=false` does) with configs/engine/sglang.yaml's arguments minus the
memory saver; --shape builds a random Qwen2.5 of that released shape (0.5b, 1.5b, 7b).

With --lora-rank the learner trains LoRA adapters and a third row pushes only the adapters
through the LoRA routes (learner.lora.sync=adapter), against the merged weights of the other two.

Both methods push the same weights to the same servers in one run (after one warm-up push each)
and the bench prints, per method, the median seconds per push, seconds per MB and per billion
parameters, and the ratio distributed/disk. Default model: the tiny random Qwen3 (~37 MB fp32,
mostly its embedding); --hidden-size/--layers build a bigger random one. Dev servers start on
127.0.0.1 (gloo, CPU) and are stopped at the end; --urls benchmarks running servers instead
(e.g. SGLang on a GPU host: the learner then broadcasts over NCCL).
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import shutil
import statistics
import tempfile
import time
from contextlib import ExitStack, contextmanager
from pathlib import Path

from agentrl.engine import EngineClient, EngineConfig, launch_engines, visible_gpus
from agentrl.learner import LearnerConfig, LoraConfig, RayConfig
from agentrl.learner.group import LearnerGroup
from agentrl.learner.ray_start import start_ray, stop_ray
from agentrl.weight_sync import WeightSyncConfig, make_weight_sync


@contextmanager
def devserver(model: str, log_dir: str):
    """One dev server on loopback (agentrl.engine.fleet does the launch, health wait and stop)."""
    with launch_engines(EngineConfig(), Path(model), Path(log_dir)) as urls:
        yield urls[0]


def gpu_split() -> tuple[list[str], str]:
    """(the learner's GPUs, the SGLang server's GPU): the server takes the last visible one."""
    ids = visible_gpus()
    if len(ids) < 2:
        raise SystemExit(
            f"--engine sglang needs 2 GPUs (learner and server apart), {len(ids)} seen"
        )
    return ids[:-1], ids[-1]


@contextmanager
def sglang_server(model: str, log_dir: str, gpu: str):
    """One SGLang server on `gpu` (loopback; launched, waited for and stopped by agentrl)."""
    import yaml

    path = Path(__file__).resolve().parents[1] / "configs" / "engine" / "sglang.yaml"
    cfg = EngineConfig(**yaml.safe_load(path.read_text()))
    extra = [a for a in cfg.extra_args if a != "--enable-memory-saver"]
    cfg = cfg.model_copy(update={"colocate": False, "extra_args": extra, "gpus": [gpu]})
    with launch_engines(cfg, Path(model), Path(log_dir)) as urls:
        yield urls[0]


async def measure(method: str, args, policy: LearnerGroup, urls: list[str], tmp: str) -> dict:
    cfg = WeightSyncConfig(  # adapter: the LoRA route, whatever weight_sync.method says
        method="disk" if method == "adapter" else method,
        bucket_mb=args.bucket_mb,
        disk_dir=os.path.join(tmp, "weights"),
    )
    async with EngineClient(urls) as engine:
        sync = make_weight_sync(cfg, policy, engine, adapters=method == "adapter")
        t0 = time.perf_counter()
        await sync.setup()
        setup_s = time.perf_counter() - t0
        await sync.push("warmup")
        times = []
        for i in range(args.repeats):
            t0 = time.perf_counter()
            await sync.push(f"{method}-{i}")
            times.append(time.perf_counter() - t0)
        await sync.close()
    # per billion parameters of the model (an adapter push moves far fewer)
    total_params = sum(math.prod(p.shape) for p in policy.param_specs())
    seconds = statistics.median(times)
    mb = sync.total_bytes / 2**20
    return {
        "method": method,
        "setup_s": setup_s,
        "seconds": seconds,
        "mb": mb,
        "s_per_mb": seconds / mb,
        "s_per_bparam": seconds / (total_params / 1e9),
        "mb_per_s": mb / seconds,
        "buckets": max(1, len(sync.buckets)),
    }


def build_model(args, tmp: str) -> str:
    if args.model:
        return args.model
    if args.shape:
        from agentrl.assets.build import build_random_qwen25

        return str(build_random_qwen25(Path(tmp) / f"qwen25-{args.shape}", args.shape))
    from agentrl.assets.build import build_tiny_random, cached_tiny_random

    if args.hidden_size is None and args.layers is None:
        return str(cached_tiny_random())
    out = Path(tmp) / "model"
    build_tiny_random(out, hidden_size=args.hidden_size or 64, num_layers=args.layers or 2)
    return str(out)


async def main_async(args) -> None:
    tmp = tempfile.mkdtemp(prefix="agentrl-bench-sync-")
    try:
        model = build_model(args, tmp)
        learner_gpus, server_gpu = gpu_split() if args.engine == "sglang" else (None, None)
        start_ray(RayConfig(num_cpus=max(2, os.cpu_count() or 2), object_store_mb=128),
                  gpus=learner_gpus)  # fmt: skip
        lora = LoraConfig(rank=args.lora_rank)
        policy = LearnerGroup(
            LearnerConfig(model_path=model, num_workers=args.workers, device=args.device, lora=lora)
        )
        methods = ("distributed", "disk", *(("adapter",) if args.lora_rank else ()))
        with ExitStack() as stack:
            if args.engine == "sglang":
                urls = [stack.enter_context(sglang_server(model, tmp, server_gpu))]
            else:
                urls = args.urls or [
                    stack.enter_context(devserver(model, tmp)) for _ in range(args.servers)
                ]
            rows = [await measure(m, args, policy, urls, tmp) for m in methods]
        policy.shutdown()
        stop_ray()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(
        f"model={model} learner_ranks={args.workers} servers={len(urls)} "
        f"bucket_mb={args.bucket_mb} repeats={args.repeats} disk_dir_fs={_fs_type(tmp)} "
        f"lora_rank={args.lora_rank}"
    )
    print(f"{'method':<12} {'MB':>8} {'buckets':>7} {'setup s':>8} {'s/push':>8} "
          f"{'s/MB':>9} {'s/Bparam':>9} {'MB/s':>8}")  # fmt: skip
    for r in rows:
        print(
            f"{r['method']:<12} {r['mb']:>8.1f} {r['buckets']:>7d} {r['setup_s']:>8.3f} "
            f"{r['seconds']:>8.3f} {r['s_per_mb']:>9.5f} {r['s_per_bparam']:>9.2f} "
            f"{r['mb_per_s']:>8.1f}"
        )
    ratio = rows[0]["s_per_mb"] / rows[1]["s_per_mb"]
    print(f"ratio distributed/disk (s per MB): {ratio:.2f}")
    if args.lora_rank:
        print(
            f"ratio adapter/distributed (s per push): {rows[2]['seconds'] / rows[0]['seconds']:.3f}"
        )


def _fs_type(path: str) -> str:
    """The file system type of the mount holding `path` (tmpfs makes `disk` look fast)."""
    best, kind = "", "?"
    try:
        for line in Path("/proc/mounts").read_text().splitlines():
            _, mnt, fs, *_ = line.split()
            if path.startswith(mnt) and len(mnt) > len(best):
                best, kind = mnt, fs
    except OSError:
        pass
    return kind


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--model", help="a local HF model dir (default: the tiny random Qwen3)")
    p.add_argument("--hidden-size", type=int, help="build a random Qwen3 of this width")
    p.add_argument("--layers", type=int, help="… and this many layers")
    p.add_argument("--workers", type=int, default=1, help="learner FSDP ranks")
    p.add_argument("--servers", type=int, default=1, help="dev servers to start")
    p.add_argument("--urls", nargs="*", help="benchmark running servers instead")
    p.add_argument("--bucket-mb", type=float, default=64.0)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    p.add_argument("--lora-rank", type=int, default=0, help="train LoRA adapters; + adapter row")
    p.add_argument("--shape", help="build a random Qwen2.5 of this released shape (0.5b, 1.5b)")
    p.add_argument("--engine", default="dev", choices=["dev", "sglang"],
                   help="sglang: one server on the last GPU, the learner on the others")  # fmt: skip
    asyncio.run(main_async(p.parse_args()))


if __name__ == "__main__":
    main()
