"""`weight_sync.method=tensor`: colocated GPUs. Each bucket of full weights goes to the servers as
CUDA-IPC handles of one buffer (SGLang `/update_weights_from_tensor`). `load_format` picks how the
server loads them (agentrl/learner/ipc.py): `direct` copies fused tensors straight into its
parameters, about twice as fast as `flattened_bucket`, which runs the model's `load_weights`.
The learner and the servers must share the host (and, for speed, the GPU).

The weights leave from the learner ranks: per bucket, every rank gathers it (a collective), the
ranks that pack for a server serialize their buffers' handles, and the one that packs a server's
TP rank 0 posts that server's request itself (`Rank.push_bucket`, with the run's token: the
`Endpoint`s the driver hands over at set-up). The driver only orders the buckets and reads the
ranks' timings; no handle passes through it.

A tensor-parallel server (`engine.tp` = N, `ranks_per_server`) gets one payload per TP rank: in
the `direct` format each TP rank t receives only its own slices of every parameter (q/k/v heads,
gate/up rows, o/down columns, vocabulary rows; agentrl/learner/tp.py), packed by the learner rank
that serves it (t mod the learner's world size: the same GPU when they are colocated one to one).
Every learner rank gathers the bucket and cuts its slices, so no GPU ever holds more than one
bucket of full weights, and no TP rank reads the whole model from GPU 0. A server's request
carries every TP rank's payload (SGLang's protocol), so when several learner ranks pack for one
server they first exchange the payloads (short strings) over the learner's own process group.

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

import httpx
import torch
import torch.distributed as dist

from agentrl import moe
from agentrl.engine import Endpoint, EngineError, post_each
from agentrl.learner import fsdp, ipc, lora, memory, tp
from agentrl.learner.fsdp import ParamSpec
from agentrl.learner.sync.base import SYNC_METHODS, Transport, WeightSyncError

log = logging.getLogger(__name__)

# SGLang pads the vocabulary dimension (TP 1) up to a multiple of this; a vocabulary that is
# already a multiple (Qwen's 151936) keeps its size and can be copied directly
VOCAB_PAD = 64


@SYNC_METHODS.register("tensor")
class TensorSync(Transport):
    summary = "hands CUDA-IPC handles to the servers"
    same_host = True  # CUDA IPC: the handles open only on this host's GPUs
    gpu_only = True
    # one bucket is one server request (~5 ms of HTTP and scheduling each) and one transient
    # buffer on the GPU: at 1.5B, 512 MB buckets pushed in 0.064 s, 4096 MB ones in 0.034 s
    # (bench/weight_sync_colocated.py, H100)
    default_bucket_mb = 4096.0

    class Rank(Transport.Rank):
        def __init__(self, worker: Any) -> None:
            super().__init__(worker)
            self.hold = ipc.IpcHold()
            self.times: dict[str, float] = {}  # this push so far: see `take_times`
            self.servers: list[Endpoint] = []  # every server, in the driver's order
            self.rows: list[list[int]] = []  # [server][TP rank] -> the learner rank packing it
            self.http: httpx.Client | None = None

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
            (the IPC handles), `wait` (the packing copies still running on the GPU), `post`
            (this rank's requests to the servers, their loading included)."""
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
            # the names the model's load_weights reads: a checkpoint's (experts one by one)
            payload, flat = ipc.flattened_payload(list(moe.to_checkpoint(tensors.items())))
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

        def connect(self, servers: list[Endpoint], rows: list[list[int]]) -> None:
            """Every server's address and token, and per server the learner rank that packs
            each TP rank's payload (`TensorSync.rows`): the one packing TP rank 0 posts."""
            self.servers, self.rows = servers, rows
            if self.http is None:
                self.http = httpx.Client()

        def push_bucket(
            self, bucket: list[ParamSpec], groups: list | None, version: str | None, last: bool
        ) -> list[str]:
            """Collective: pack one bucket (`tp_bucket` for a direct bucket at TP > 1, else
            `direct_bucket` with its fused `groups` or `bucket`) and post each server whose TP
            rank 0 this rank packs `/update_weights_from_tensor`; `last` flushes their cache,
            `version` stamps them. Returns what the servers refused (empty: all loaded it)."""
            w, rows = self.worker, self.rows
            self.hold.release()  # the last bucket's: every server has answered for it
            n = len(rows[0])
            if groups is not None and n > 1:  # each TP rank's own slices
                got = {w.rank: self.tp_bucket(bucket, n, rows)}
                if any(r != row[0] for row in rows for r in row):  # several packers a server
                    everyone: list[Any] = [None] * w.world_size
                    dist.all_gather_object(everyone, got[w.rank])
                    got = dict(enumerate(everyone))
                mine = {s: [got[r][t] for t, r in enumerate(row)]
                        for s, row in enumerate(rows) if row[0] == w.rank}  # fmt: skip
            else:  # the same full tensors for every TP rank: its loader cuts its slices
                packers = sorted({row[0] for row in rows})
                one = (self.direct_bucket(bucket, groups, packers) if groups is not None
                       else self.bucket(bucket, packers))  # fmt: skip
                mine = {s: [one] * n for s, row in enumerate(rows) if row[0] == w.rank}
            fmt = "flattened_bucket" if groups is None else "direct"
            body = {"weight_version": version, "load_format": fmt, "flush_cache": last}
            calls = [(self.servers[s], {"serialized_named_tensors": p, **body})
                     for s, p in mine.items()]  # fmt: skip
            if self.http is None:
                raise RuntimeError("TensorSync.Rank.push_bucket before connect (setup)")
            t0 = time.perf_counter()
            try:
                post_each(self.http, "/update_weights_from_tensor", calls)
            except EngineError as e:
                return [str(e)]
            finally:
                self._timed("post", t0)
            return []

        def release(self) -> None:
            self.hold.release()

        def close(self) -> None:
            self.hold.release()
            if self.http is not None:
                self.http.close()
                self.http = None

    def __init__(self, *a: Any, **kw: Any) -> None:
        super().__init__(*a, **kw)
        self.groups: list = []
        self.packers: list[list[int]] | None = None  # [server][TP rank] -> learner rank
        self.rows: list[list[int]] = []  # the same for every server (packers, or t % ranks)

    async def setup(self) -> None:
        self._plan()
        n = self.cfg.ranks_per_server
        self.packers = None
        if self.server_gpus:
            ranks = self.ranks(TensorSync.Rank.gpu_id)
            self.packers = plan_packers(self.server_gpus, ranks, n)
            log.info("colocated push: learner ranks on GPUs %s pack for servers on %s: %s",
                     ranks, self.server_gpus, self.packers)  # fmt: skip
        # without the servers' GPUs: TP rank t's payload from learner rank t mod the world size,
        # the same for every server (one server, or several sharing these GPUs)
        default = [t % self.learner.world_size for t in range(n)]
        self.rows = self.packers or [default] * len(self.engine.urls)
        self.ranks(TensorSync.Rank.connect, self.engine.endpoints(), self.rows)
        specs = [s for b in self.buckets for s in b]
        fmt, self.groups = load_format(self.cfg.load_format, n, specs), []
        if fmt in ("direct", "auto"):
            self.buckets, self.groups = plan_direct(specs, self.bucket_mb)

    async def push(self, version: str) -> dict[str, float]:
        if not self.buckets:
            await self.setup()
        t0 = time.perf_counter()
        try:
            await self._send_or_fall_back(version)
        except BaseException:
            # the ranks' timings of a failed push are not the next one's (not awaited: a dead
            # rank must not hide this error behind its own)
            self.learner.on_ranks_async(self.Rank, TensorSync.Rank.take_times)
            raise
        self.version = version
        seconds = time.perf_counter() - t0
        per_rank = self.ranks(TensorSync.Rank.take_times)
        parts = {k: max(r.get(k, 0.0) for r in per_rank) for k in {k for r in per_rank for k in r}}
        engine_s = parts.pop("post", 0.0)
        return {
            **self._metrics(seconds),
            "sync/direct": float(bool(self.groups)),
            # gather + pack + IPC handles and the calls to the ranks: the push less its requests
            "sync/learner_s": seconds - engine_s,
            "sync/engine_s": engine_s,  # the servers' update requests (the slowest rank's)
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
        """Bucket by bucket, the ranks pack and post (`Rank.push_bucket`); the last one stamps
        the servers with `version` and flushes their cache."""
        try:
            for i, bucket in enumerate(self.buckets):
                last = i == len(self.buckets) - 1
                groups = self.groups[i] if self.groups else None
                refused = await asyncio.to_thread(
                    self.ranks, TensorSync.Rank.push_bucket, bucket, groups,
                    version if last else None, last,
                )  # fmt: skip
                if errors := [e for per_rank in refused for e in per_rank]:
                    fmt = "flattened_bucket" if groups is None else "direct"
                    raise WeightSyncError(
                        f"weights v{version}: a server rejected bucket {i} over CUDA IPC "
                        f"(load_format={fmt}: {'; '.join(errors)}); the servers must run on this "
                        "host's GPUs (or use weight_sync.method=distributed)"
                    )
        finally:
            # every server has copied the last bucket (or failed): drop its buffers. Not
            # awaited: the actor runs calls in order, so they are freed before anything else
            self.learner.on_ranks_async(self.Rank, TensorSync.Rank.release)


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


def load_format(asked: str, tp: int, specs: list[ParamSpec]) -> str:
    """The push's load format: `asked`, except that at TP > 1 a mixture-of-experts model goes
    as flattened buckets: a TP rank's share of SGLang's fused-MoE parameters is not planned
    (tp.py), while the model's load_weights slices each expert's checkpoint tensors itself."""
    if tp == 1 or not any(moe.fused_expert(s.name) for s in specs):
        return asked
    if asked == "direct":
        raise WeightSyncError(
            "weight_sync.load_format=direct at engine.tp > 1 does not cover a mixture-of-experts "
            "model's experts; use load_format=auto or flattened_bucket"
        )
    return "flattened_bucket"


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
