"""`weight_sync.method=tensor`: colocated GPUs. Each bucket of full weights goes to the servers as
CUDA-IPC handles of one buffer (SGLang `/update_weights_from_tensor`). `load_format` picks how the
server loads them (agentrl/learner/ipc.py): `direct` copies fused tensors straight into its
parameters, about twice as fast as `flattened_bucket`, which runs the model's `load_weights`.
The learner and the servers must share the host (and, for speed, the GPU).

A tensor-parallel server (`engine.tp` = N, `ranks_per_server`) gets one payload per TP rank: in
the `direct` format each TP rank t receives only its own slices of every parameter (q/k/v heads,
gate/up rows, o/down columns, vocabulary rows; agentrl/learner/tp.py), packed by the learner rank
that serves it (t mod the learner's world size: the same GPU when they are colocated one to one).
Every learner rank gathers the bucket and cuts its slices, so no GPU ever holds more than one
bucket of full weights, and no TP rank reads the whole model from GPU 0.

Several colocated servers (`engine.num_servers` > 1, agentrl/engine/fleet.py): each server sees only its
own GPUs, and every payload it gets is packed by the learner rank on the same GPU (`plan_packers`,
from the GPU ids the servers were started on, `Transport.server_gpus`, and the ranks' own): no
handle crosses GPUs. A server GPU without a learner rank is an error at set-up, naming
`learner.num_workers`."""

from __future__ import annotations

import asyncio
import logging
import os
import time
from typing import Any

import torch

from agentrl.learner import fsdp, ipc, lora, memory, tp
from agentrl.learner.fsdp import ParamSpec
from agentrl.learner.sync.base import SYNC_METHODS, Transport, WeightSyncError

log = logging.getLogger(__name__)

# SGLang pads the vocabulary dimension (TP 1) up to a multiple of this; a vocabulary that is
# already a multiple (Qwen's 151936) keeps its size and can be copied directly
VOCAB_PAD = 64


@SYNC_METHODS.register("tensor")
class TensorSync(Transport):
    name = "tensor"
    # one bucket is one server request (~5 ms of HTTP and scheduling each) and one transient
    # buffer on the GPU: at 1.5B, 512 MB buckets pushed in 0.064 s, 4096 MB ones in 0.034 s
    # (bench/weight_sync_colocated.py, H100)
    default_bucket_mb = 4096.0

    class Rank(Transport.Rank):
        def __init__(self, worker: Any) -> None:
            super().__init__(worker)
            self.hold = ipc.IpcHold()
            self.times: dict[str, float] = {}  # this push so far: see `take_times`

        def _timed(self, key: str, t0: float) -> float:
            now = time.perf_counter()
            self.times[key] = self.times.get(key, 0.0) + now - t0
            return now

        def _start(self) -> float:
            """The first bucket of a push first waits for the GPU work queued before it (the
            optimizer step, an onload's copies): `pending` in `take_times`."""
            t0 = time.perf_counter()
            if not self.times:
                torch.cuda.synchronize()
                t0 = self._timed("pending", t0)
            return t0

        def _handed(self, t0: float) -> None:
            """The server reads the memory as soon as it has the handle: wait for the packing
            copies (`wait`: GPU time the host's packing did not hide)."""
            torch.cuda.synchronize()
            self._timed("wait", t0)

        def take_times(self) -> dict[str, float]:
            """Seconds this rank spent in the push since the last call, by part: `pending` (GPU
            work queued before the push), `pack` (gather, cast, copy: host time; the direct
            format splits it into pack_gather, pack_alloc, pack_copy), `serialize`
            (the IPC handles), `wait` (the packing copies still running on the GPU)."""
            out, self.times = self.times, {}
            return out

        def gpu_id(self) -> str:
            """This rank's GPU as the host names it (Ray sets CUDA_VISIBLE_DEVICES per actor)."""
            index = torch.device(self.worker.device).index or 0
            visible = os.environ.get("CUDA_VISIBLE_DEVICES", "")
            ids = [g.strip() for g in visible.split(",") if g.strip()]
            return ids[index] if index < len(ids) else str(index)

        def bucket(self, bucket: list[ParamSpec], packers: list[int] = (0,)) -> str | None:
            """Collective: gather one bucket's full tensors on the GPU; the `packers` ranks
            return SGLang's `flattened_bucket` CUDA-IPC payload, each of a buffer on its own
            GPU, and keep it alive until `release`."""
            w, t0 = self.worker, self._start()
            tensors = fsdp.gather_full(w.model, bucket, w.rank, w.device, set(packers) != {0})
            if w.rank not in packers:
                return None
            payload, flat = ipc.flattened_payload(list(tensors.items()))
            self.hold.keep(flat)
            self._handed(self._timed("pack", t0))
            return payload

        def direct_bucket(
            self, bucket: list[ParamSpec], groups: list, packers: list[int] = (0,)
        ) -> str | None:
            """Collective: like `bucket`, in SGLang's `direct` layout (ipc.py): q/k/v and
            gate/up fused per `groups`, cast and copied once into one buffer, sent as views."""
            w, t0 = self.worker, self._start()
            if w.world_size > 1 or lora.is_lora(w.model):  # gather (and merge LoRA adapters)
                every = set(packers) != {0}
                get = fsdp.gather_full(w.model, bucket, w.rank, w.device, every).__getitem__
            else:  # one shard is the whole tensor: read it in place
                params = dict(w.model.named_parameters())
                get = lambda name: fsdp.full_param(params[name])  # noqa: E731
            if w.rank not in packers:
                return None
            dtype = fsdp.to_dtype(bucket[0].dtype)
            clock = [t0]

            def mark(part: str) -> None:
                clock[0] = self._timed(f"pack_{part}", clock[0])

            with torch.no_grad():
                flat, views = ipc.pack_direct(get, groups, dtype, w.device, mark)
            t0 = clock[0]
            payload = ipc.serialize(views)
            self.hold.keep(flat)
            self._handed(self._timed("serialize", t0))
            return payload

        def tp_views(
            self, bucket: list[ParamSpec], tp_size: int, packers: list[list[int]] | None = None
        ) -> dict[int, tuple[torch.Tensor, list[tuple[str, torch.Tensor]]]]:
            """Collective: for every TP rank t this learner rank serves (in `packers`, the
            [server][TP rank] -> learner rank plan; default t % world_size == rank), t's slices
            of the bucket in SGLang's names and per-rank shapes, as views of one flat buffer on
            this rank's device: {t: (flat, [(name, view)])}."""
            w = self.worker
            full = fsdp.gather_full(w.model, bucket, w.rank, w.device, every_rank=True)
            heads = memory.heads_of(w.model.config)
            plan = tp.plan_tp([(s.name, s.shape) for s in bucket], tp_size, heads)
            dtype = fsdp.to_dtype(bucket[0].dtype)
            packers = packers or [[t % w.world_size for t in range(tp_size)]]
            mine = sorted({t for row in packers for t, r in enumerate(row) if r == w.rank})
            out = {t: tp.pack(full.__getitem__, plan[t], dtype, w.device) for t in mine}
            del full
            return out

        def tp_bucket(
            self, bucket: list[ParamSpec], tp_size: int, packers: list[list[int]] | None = None
        ) -> dict[int, str]:
            """Collective: `tp_views` as SGLang `direct` CUDA-IPC payloads, one per TP rank this
            learner rank serves; their buffers are kept until `release`."""
            t0, out = self._start(), {}
            packed = self.tp_views(bucket, tp_size, packers)
            t0 = self._timed("pack", t0)
            for t, (flat, views) in packed.items():
                self.hold.keep(flat)
                out[t] = ipc.serialize(views)
            self._handed(self._timed("serialize", t0))
            return out

        def release(self) -> None:
            self.hold.release()

        def close(self) -> None:
            self.hold.release()

    def __init__(self, *a: Any, **kw: Any) -> None:
        super().__init__(*a, **kw)
        self.groups: list = []
        self.packers: list[list[int]] | None = None  # [server][TP rank] -> learner rank
        self.learner_s = self.engine_s = 0.0

    async def setup(self) -> None:
        if self.learner.cfg.resolved_device() != "cuda":
            raise WeightSyncError(
                "weight_sync.method=tensor shares CUDA memory and needs the learner on a GPU; "
                "use weight_sync.method=distributed (or disk) on CPU"
            )
        self._plan()
        if self.server_gpus:
            ranks = self.rank_call("gpu_id")
            self.packers = plan_packers(self.server_gpus, ranks, self.cfg.ranks_per_server)
            log.info("colocated push: learner ranks on GPUs %s pack for servers on %s: %s",
                     ranks, self.server_gpus, self.packers)  # fmt: skip
        fmt, self.groups = self.cfg.load_format, []
        if fmt in ("direct", "auto"):
            self.buckets, self.groups = plan_direct(
                [s for b in self.buckets for s in b], self.bucket_mb
            )

    async def push(self, version: str) -> dict[str, float]:
        if not self.buckets:
            await self.setup()
        t0 = time.perf_counter()
        try:
            await self._send_or_fall_back(version)
        except BaseException:
            # the ranks' timings of a failed push are not the next one's (not awaited: a dead
            # rank must not hide this error behind its own)
            self.learner.call_async("sync_call", self.name, "take_times")
            raise
        self.version = version
        seconds = time.perf_counter() - t0
        per_rank = self.rank_call("take_times")
        parts = {k: max(r.get(k, 0.0) for r in per_rank) for k in {k for r in per_rank for k in r}}
        return {
            **self._metrics(seconds),
            "sync/direct": float(bool(self.groups)),
            "sync/learner_s": self.learner_s,  # gather + pack + IPC handles (learner rank 0)
            "sync/engine_s": self.engine_s,  # the servers' update requests
            **{f"sync/learner_{k}_s": v for k, v in parts.items()},  # the slowest rank's, by part
        }

    async def _send_or_fall_back(self, version: str) -> None:
        try:
            await self._send(version)
        except WeightSyncError as e:
            if not (self.cfg.load_format == "auto" and self.groups):
                raise
            log.warning("direct weight load rejected (%s); using flattened_bucket from now on", e)
            self.groups = []
            self._plan()
            await self._send(version)  # every parameter again: the model's own loader

    async def _send(self, version: str) -> None:
        self.learner_s = self.engine_s = 0.0
        for i, bucket in enumerate(self.buckets):
            last = i == len(self.buckets) - 1
            direct = bool(self.groups) and self.groups[i] is not None
            fmt = "direct" if direct else "flattened_bucket"
            t0 = time.perf_counter()
            payloads = await asyncio.to_thread(self._payloads, bucket, direct, i)
            t1 = time.perf_counter()
            try:
                await self.engine.control.update_weights_from_tensor(
                    payloads,
                    weight_version=version if last else None,
                    load_format=fmt,
                    flush_cache=last,
                )
            except Exception as e:
                raise WeightSyncError(
                    f"weights v{version}: a server rejected bucket {i} over CUDA IPC "
                    f"(load_format={fmt}: {e}); the servers must run on this host's GPUs "
                    "(or use weight_sync.method=distributed)"
                ) from e
            finally:
                # the server has copied the bucket: drop the buffer. Not awaited: the actor runs
                # calls in order, so it is freed before the next bucket or anything else
                self.learner.call_async("sync_call", self.name, "release")
            self.learner_s += t1 - t0
            self.engine_s += time.perf_counter() - t1

    def _payloads(
        self, bucket: list[ParamSpec], direct: bool, i: int
    ) -> list[str] | list[list[str]]:
        """One payload per TP rank: the TP ranks' own slices (direct, TP > 1), or the same full
        tensors for every rank, whose loader cuts its slices itself; each packed by the learner
        rank `packers` names. Per server when the servers' GPUs are known, else one list that
        every server gets."""
        n = self.cfg.ranks_per_server
        packers = self.packers or [[t % len(self.learner.workers) for t in range(n)]]
        if direct and n > 1:
            got = self.rank_call("tp_bucket", bucket, n, packers)
            rows = [[got[r][t] for t, r in enumerate(row)] for row in packers]
        else:
            args = ("direct_bucket", bucket, self.groups[i]) if direct else ("bucket", bucket)
            got = self.rank_call(*args, sorted({row[0] for row in packers}))
            rows = [[got[row[0]]] * n for row in packers]
        return rows if self.packers else rows[0]


def plan_packers(
    server_gpus: list[list[str]], rank_gpus: list[str], tp_size: int
) -> list[list[int]]:
    """[server][TP rank] -> the learner rank that packs its CUDA-IPC payload: the one on that
    TP rank's GPU. One server (it sees every GPU its learner ranks may hold) may fall back to
    t mod the learner's world size; several cannot (each sees only its own GPUs): an error."""
    out = []
    for s, gpus in enumerate(server_gpus):
        row = []
        for t in range(tp_size):
            gpu = gpus[t] if t < len(gpus) else None
            if gpu in rank_gpus:
                row.append(rank_gpus.index(gpu))
            elif len(server_gpus) == 1:
                row.append(t % len(rank_gpus))
            else:
                raise WeightSyncError(
                    f"colocated rollout server {s} runs on GPU {gpu}, where no learner rank is "
                    f"(learner ranks on GPUs {rank_gpus}); a CUDA-IPC push needs one on every "
                    f"server's GPU: learner.num_workers={len(server_gpus) * tp_size} "
                    "(engine.num_servers x engine.tp)"
                )
        out.append(row)
    return out


def plan_direct(specs: list[ParamSpec], bucket_mb: float) -> tuple[list[list], list]:
    """(buckets of specs, per bucket its fused groups or None) for the `direct` format. A fused
    group (agentrl/learner/ipc.py) is never split across requests. Vocabulary-sized tensors
    (embeddings, lm_head) whose vocabulary the engine pads (SGLang: up to a multiple of
    `VOCAB_PAD`) come first, in a bucket of their own (groups None) that the model's own loader
    takes: a direct copy with a mismatched shape kills the server."""
    by_name = {s.name: s for s in specs}
    vocab = [n for n, s in by_name.items() if is_vocab_param(n) and s.shape[0] % VOCAB_PAD]
    limit = bucket_mb * 2**20
    buckets: list[list] = [[by_name[n] for n in vocab]] if vocab else []
    groups: list = [None] if vocab else []
    size = limit
    for target, names in ipc.direct_groups([n for n in by_name if n not in vocab]):
        nbytes = sum(by_name[n].nbytes for n in names)
        if size + nbytes > limit:
            buckets.append([])
            groups.append([])
            size = 0
        buckets[-1] += [by_name[n] for n in names]
        groups[-1].append((target, names))
        size += nbytes
    return buckets, groups


def is_vocab_param(name: str) -> bool:
    """Embedding and output-head weights, whose first dimension the engines may pad."""
    return name.endswith(("embed_tokens.weight", "lm_head.weight", "wte.weight"))
