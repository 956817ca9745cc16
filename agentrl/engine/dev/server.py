"""A small transformers-backed server speaking the SGLang HTTP subset agentrl uses (CPU machines).

    python -m agentrl.engine.dev --model PATH --host 127.0.0.1 --port 30000 [--device cpu]

It behaves like `sglang.launch_server --skip-tokenizer-init`: POST /generate takes `input_ids`
(one list, or a list of lists for a batch) and returns `output_ids` + `meta_info` (finish_reason,
prompt/completion tokens, weight_version, `output_token_logprobs` = [[logprob, id, null], ...]).
Logprobs are log_softmax(logits / temperature) of the sampled ids, before top-k/top-p/min-p
filtering (SGLang's default); temperature 0 is greedy with raw-logit logprobs. Every sampled id
is returned, the matched stop token included (SGLang does the same: see agentrl/engine/protocol.py).

Scheduling is continuous batching on one KV cache: each step admits waiting requests (a
left-padded prefill of all of them), merges their caches into the running batch (left-padding
to a common length), decodes one token for every running request, and drops finished rows.
`--scheduler dynamic` admits only into an empty batch (bench/devserver_throughput.py compares).
Admin routes follow SGLang: weight updates wait for requests in flight (new ones wait behind
them) unless generation is paused, and run between scheduler steps. What differs on CPU:
  - /update_weights_from_tensor takes base64 safetensors bytes per entry
    (`agentrl.engine.protocol.encode_named_tensors`), not pickled CUDA-IPC handles.
  - /release_memory_occupation and /resume_memory_occupation keep the model in host memory but
    track the released tags; a generation (a /generate or /health_generate) while any tag is
    released kills the server, as it kills SGLang's scheduler (its kernels read freed memory).
  - the prefix cache (`--prefix-cache-mb`, agentrl/engine/dev/cache.py) keeps whole sequences, not a
    radix tree of pages; `cached_tokens` counts what it held, and /flush_cache empties it (refused
    while requests run, as SGLang does). Weight updates empty it too.
  - no stop strings / regex / streaming (no tokenizer): such requests get a 400. The frequency,
    presence and repetition penalties are SGLang's (agentrl/engine/dev/batch.py: penalized).
  - LoRA adapters (/load_lora_adapter, `lora_path`): one adapter per batch (agentrl/engine/dev/lora.py).
  - /health answers from the scheduler's state; /health_generate runs a 1-token generation.
  - --enable-deterministic-inference (SGLang's name; trainer.deterministic passes it) computes
    each request alone, a batch of one with no prefix cache: a request's ids and logprobs follow
    from its prompt, sampling parameters and `sampling_seed` alone, never from the requests
    timing put beside it (batched, its logprobs move by ~1e-5). Slower: the tiny model's 64
    requests x 40 tokens took 4.5x as long. Unseeded requests still draw from one generator
    shared in arrival order.
  - the key (SGLang: --api-key, --admin-api-key) comes from $AGENTRL_ENGINE_API_KEY, off the
    command line; with it every route but /health answers 401 without
    `Authorization: Bearer <key>` (agentrl.engine.dev.routes.BearerAuth), /health_generate too.
Distributed weight updates join a gloo group the way SGLang's `init_custom_process_group` does
(tcp store hosted by rank 0, keys prefixed with the group name; server rank = rank_offset), with
the code learner rank 0 uses too (`agentrl.learner.update_group`), for a dev server or SGLang.
"""

from __future__ import annotations

import asyncio
import logging
import os
from contextlib import asynccontextmanager, suppress
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from agentrl.engine.dev.batch import BatchEngine
from agentrl.engine.dev.lora import Adapters, add_lora_routes, pick
from agentrl.engine.dev.request import (
    BadRequest,
    Limits,
    Req,
    abort_reason,
    decode_named_tensors,
    parse_generate,
    response,
    torch_dtype,
)
from agentrl.engine.dev.routes import (
    BearerAuth,
    add_admin_routes,
    add_generation_routes,
    add_weight_routes,
)
from agentrl.engine.protocol import ROUTING_KEY_HEADER
from agentrl.learner.update_group import init_update_group
from agentrl.moe import routers

log = logging.getLogger("agentrl.engine.dev")


@dataclass
class ServerArgs:
    model: str
    device: str = "cpu"
    dtype: str = "float32"
    attn_implementation: str = "sdpa"
    context_length: int | None = None
    max_running_requests: int = 64
    max_prefill_tokens: int = 8192
    scheduler: str = "continuous"
    weight_version: str = "default"
    seed: int = 0
    dist_timeout_s: float = 1800.0
    prefix_cache_mb: float = 256.0
    enable_deterministic_inference: bool = False
    enable_return_routed_experts: bool = False


def die_released(released: set[str]) -> None:
    """What SGLang does when asked to generate with memory released: its scheduler crashes
    (Triton: "Pointer argument ... cannot be accessed") and takes the server down. The dev server
    exits as loudly, so a caller that sends work to a released server fails its CPU tests."""
    log.error(
        "a generation arrived while memory %s is released (/release_memory_occupation): SGLang's "
        "scheduler crashes on this; the dev server exits the same way",
        sorted(released),
    )
    logging.shutdown()
    os._exit(70)


class RWLock:
    """Many readers (requests in flight) or one writer (a weight update); writers go first."""

    def __init__(self) -> None:
        self._cond = asyncio.Condition()
        self._readers = 0
        self._writer = False
        self._writers_waiting = 0

    @asynccontextmanager
    async def read(self):
        async with self._cond:
            await self._cond.wait_for(lambda: not self._writer and not self._writers_waiting)
            self._readers += 1
        try:
            yield
        finally:
            async with self._cond:
                self._readers -= 1
                self._cond.notify_all()

    @asynccontextmanager
    async def write(self):
        async with self._cond:
            self._writers_waiting += 1
            try:
                await self._cond.wait_for(lambda: not self._writer and not self._readers)
            finally:
                self._writers_waiting -= 1
            self._writer = True
        try:
            yield
        finally:
            async with self._cond:
                self._writer = False
                self._cond.notify_all()


class DevServer:
    """Request queue, scheduler task, locks and the admin operations behind the routes."""

    def __init__(self, args: ServerArgs):
        self.args = args
        self.engine = BatchEngine(
            args.model,
            args.device,
            torch_dtype(args.dtype),
            args.attn_implementation,
            args.seed,
            args.prefix_cache_mb,
            solo=args.enable_deterministic_inference,
        )
        self.context_len = args.context_length or self.engine.context_len
        self.weight_version = args.weight_version
        self.waiting: list[Req] = []
        self.inflight: dict[str, Req] = {}
        self.routing_keys: dict[str, int] = {}
        self.paused = False
        self.released: set[str] = set()  # memory tags released (/release_memory_occupation)
        self.groups: dict[str, dist.ProcessGroup] = {}
        self.lora = Adapters()  # LoRA adapters by name (agentrl/engine/dev/lora.py)
        self.task: asyncio.Task | None = None

    async def start(self) -> None:
        self.model_lock = asyncio.Lock()  # held by a scheduler step or a weight copy
        self.rw = RWLock()
        self.work = asyncio.Event()
        self.task = asyncio.create_task(self.run())

    async def stop(self) -> None:
        if self.task is not None:
            self.task.cancel()
            with suppress(asyncio.CancelledError):
                await self.task
        for r in list(self.inflight.values()):
            r.finish = abort_reason("server shutting down") | {"status_code": 503}
            self.resolve(r)

    @property
    def alive(self) -> bool:
        return self.task is not None and not self.task.done()

    # -- generation ----------------------------------------------------------------------------

    async def generate(self, body: Any, request: Request | None = None) -> tuple[Any, int]:
        if self.released:
            die_released(self.released)
        routed = self.args.enable_return_routed_experts and bool(routers(self.engine.model))
        limits = Limits(self.engine.vocab_size, self.context_len, self.inflight, self.lora.names,
                        routed)  # fmt: skip
        reqs, single = parse_generate(body, limits)
        key = request.headers.get(ROUTING_KEY_HEADER) if request is not None else None
        if key is not None:  # which episodes a router sent here (server_info; bounded)
            self.routing_keys[key] = self.routing_keys.pop(key, 0) + len(reqs)
            while len(self.routing_keys) > 4096:
                del self.routing_keys[next(iter(self.routing_keys))]
        async with self.rw.read():
            for r in reqs:
                if r.max_new_tokens == 0:
                    r.finish = {"type": "length", "length": 0}
                    r.fut.set_result(None)
                    continue
                self.inflight[r.rid] = r
                self.waiting.append(r)
            self.work.set()
            watch = asyncio.create_task(self._watch_disconnect(request, reqs))
            try:
                await asyncio.gather(*(r.fut for r in reqs))
            finally:
                watch.cancel()
                for r in reqs:  # cancelled (shutdown): the next step drops what is left
                    r.abort = r.abort or (None if r.fut.done() else "cancelled")
                self.work.set()
        outs = [response(r, self.weight_version) for r in reqs]
        status = max((r.finish or {}).get("status_code") or 200 for r in reqs)
        return (outs[0] if single else outs), status

    async def _watch_disconnect(self, request: Request | None, reqs: list[Req]) -> None:
        while request is not None:
            await asyncio.sleep(1.0)
            if await request.is_disconnected():
                await self.abort_reqs(reqs, "client disconnected")
                return

    def resolve(self, r: Req) -> None:
        self.inflight.pop(r.rid, None)
        r.version = self.weight_version
        if not r.fut.done():
            r.fut.set_result(None)

    def admit(self) -> list[Req]:
        for r in [r for r in self.waiting if r.abort is not None]:
            self.waiting.remove(r)
            r.finish = abort_reason(r.abort)
            self.resolve(r)
        running = self.engine.running()
        if self.args.scheduler == "dynamic" and running:
            return []
        # one LoRA adapter per batch: the running one's, or the first waiting request's
        lora = running[0].lora if running else (self.waiting[0].lora if self.waiting else None)
        slots = self.args.max_running_requests - len(running)
        new = pick(self.waiting, lora, slots, self.args.max_prefill_tokens)
        taken = {id(r) for r in new}
        self.waiting = [r for r in self.waiting if id(r) not in taken]
        return new

    def step(self, new: list[Req]) -> list[Req]:
        if new and self.engine.idle:  # a new batch: its adapter's weights
            self.lora.switch(self.engine, new[0].lora)
        return self.engine.step(new)

    async def run(self) -> None:
        """The scheduler: one engine step at a time, in a worker thread, between admin work."""
        while True:
            if self.paused or (not self.waiting and self.engine.idle):
                self.work.clear()
                await self.work.wait()
                continue
            async with self.model_lock:
                if self.paused:
                    continue
                new = self.admit()
                if not new and self.engine.idle:
                    continue
                try:
                    done = await asyncio.to_thread(self.step, new)
                except Exception as e:  # a broken step fails its requests, not the server
                    log.exception("scheduler step failed")
                    done = new + self.engine.running()
                    self.engine.clear()
                    for r in done:
                        r.finish = abort_reason(f"{type(e).__name__}: {e}") | {"status_code": 500}
            for r in done:
                self.resolve(r)

    # -- admin ---------------------------------------------------------------------------------

    async def abort(self, rid: str | None, abort_all: bool, message: str) -> int:
        targets = list(self.inflight.values()) if abort_all else []
        if rid and rid in self.inflight:
            targets.append(self.inflight[rid])
        await self.abort_reqs(targets, message)
        return len(targets)

    async def abort_reqs(self, reqs: list[Req], message: str) -> None:
        for r in reqs:
            if not r.fut.done():
                r.abort = r.abort or message
        async with self.model_lock:  # resolve now, even while the scheduler is paused
            for r in [r for r in self.waiting if r.abort is not None]:
                self.waiting.remove(r)
                r.finish = abort_reason(r.abort)
                self.resolve(r)
            for r in self.engine.drop_aborted():
                self.resolve(r)
        self.work.set()

    async def pause(self, mode: str) -> None:
        if mode not in ("abort", "retract", "in_place"):
            raise BadRequest(f"Invalid mode: {mode!r}. Expected one of abort, retract, in_place.")
        async with self.model_lock:  # returns once no step is running
            self.paused = True
            if mode == "retract":
                self.waiting[:0] = self.engine.retract()
        if mode == "abort":
            await self.abort(None, True, "aborted by /pause_generation")

    async def resume(self) -> None:
        self.paused = False
        self.work.set()

    @asynccontextmanager
    async def weight_update(self, abort_all: bool):
        """As SGLang: wait for requests in flight and hold new ones back, unless paused."""
        if abort_all:
            await self.abort(None, True, "aborted for a weight update")
        if self.paused:
            yield
        else:
            async with self.rw.write():
                yield

    async def load_named(self, tensors: dict[str, torch.Tensor]) -> None:
        async with self.model_lock:  # the base changes: adapters apply to the new one
            await asyncio.to_thread(self.lora.rebase, self.engine.model)
            await asyncio.to_thread(self.engine.load_named, tensors)

    async def update_from_disk(self, body: dict) -> dict[str, Any]:
        path = body.get("model_path")
        if not path:
            raise BadRequest("model_path is required")
        async with self.weight_update(bool(body.get("abort_all_requests"))):
            try:
                model = await asyncio.to_thread(self.engine.load, str(path))
            except (OSError, ValueError) as e:
                raise BadRequest(f"cannot load weights from {path}: {e}") from e
            old, new = self.engine.model.config, model.config
            if (new.vocab_size, new.num_hidden_layers) != (old.vocab_size, old.num_hidden_layers):
                raise BadRequest(f"{path} is not the served architecture (vocab/layers differ)")
            async with self.model_lock:
                self.lora.rebase(None)
                self.engine.model = model
                self.engine.weights_changed()
        return self.set_version(body.get("weight_version"), f"Loaded weights from {path}.")

    def set_version(self, version: str | None, message: str) -> dict[str, Any]:
        if version is not None:
            self.weight_version = str(version)
            message += f" Weight version updated to {version}."
        return {"success": True, "message": message, "num_paused_requests": 0}

    async def init_group(self, body: dict) -> dict[str, Any]:
        name = body.get("group_name", "weight_update_group")
        backend = body.get("backend", "nccl")
        if name in self.groups:
            raise BadRequest(f"group {name!r} exists: call /destroy_weights_update_group first")
        if backend != "gloo" and self.engine.device.type == "cpu":
            raise BadRequest(
                f"backend {backend!r}: the dev server on CPU joins gloo groups only; "
                "pass backend='gloo' on both sides"
            )
        try:
            addr, port = str(body["master_address"]), int(body["master_port"])
            rank, world = int(body["rank_offset"]), int(body["world_size"])
        except (KeyError, ValueError) as e:
            raise BadRequest(f"init_weights_update_group needs {e}") from e
        self.groups[name] = await asyncio.to_thread(
            init_update_group, addr, port, rank, world, name, backend, self.args.dist_timeout_s
        )
        return {"success": True, "message": f"joined {name} as rank {rank} of {world}"}

    async def update_from_distributed(self, body: dict) -> dict[str, Any]:
        name = body.get("group_name", "weight_update_group")
        if name not in self.groups:
            raise BadRequest(f"no group {name!r}: call /init_weights_update_group first")
        names, dtypes, shapes = body.get("names"), body.get("dtypes"), body.get("shapes")
        if not names or not (len(names) == len(dtypes or ()) == len(shapes or ())):
            raise BadRequest("names, dtypes and shapes must be non-empty lists of equal length")
        empty = [torch.empty(s, dtype=torch_dtype(d)) for d, s in zip(dtypes, shapes, strict=True)]
        pg = self.groups[name]

        def receive() -> list[torch.Tensor]:
            works = [dist.broadcast(t, src=0, group=pg, async_op=True) for t in empty]
            for w in works:
                w.wait()
            return empty

        async with self.weight_update(bool(body.get("abort_all_requests"))):
            tensors = await asyncio.to_thread(receive)
            await self.load_named(dict(zip(names, tensors, strict=True)))
        return self.set_version(body.get("weight_version"), f"Updated {len(names)} tensors.")

    async def destroy_group(self, body: dict) -> dict[str, Any]:
        name = body.get("group_name", "weight_update_group")
        pg = self.groups.pop(name, None)
        if pg is None:
            raise BadRequest(f"no group {name!r}")
        await asyncio.to_thread(dist.destroy_process_group, pg)
        return {"success": True, "message": f"destroyed {name}"}

    async def update_from_tensor(self, body: dict) -> dict[str, Any]:
        fmt = body.get("load_format")
        if fmt not in (None, "safetensors"):
            raise BadRequest(f"load_format {fmt!r}: the dev server takes base64 safetensors")
        tensors: dict[str, torch.Tensor] = {}
        for payload in body.get("serialized_named_tensors") or []:
            tensors.update(decode_named_tensors(payload))
        if not tensors:
            raise BadRequest("serialized_named_tensors is empty")
        async with self.weight_update(bool(body.get("abort_all_requests"))):
            await self.load_named(tensors)
        return self.set_version(body.get("weight_version"), f"Updated {len(tensors)} tensors.")

    def model_info(self) -> dict[str, Any]:
        return {
            "model_path": self.args.model,
            "tokenizer_path": self.args.model,
            "is_generation": True,
            "preferred_sampling_params": None,
            "weight_version": self.weight_version,
            "has_image_understanding": False,
            "has_audio_understanding": False,
            "context_length": self.context_len,
            "vocab_size": self.engine.vocab_size,
            "eos_token_ids": sorted(self.engine.eos_ids),
        }

    def server_info(self) -> dict[str, Any]:
        e = self.engine
        state = {
            "num_running_reqs": len(e.running()),
            "num_waiting_reqs": len(self.waiting),
            "paused": self.paused,
            "stats": dict(e.stats),
            "decode_batch_sizes": {str(k): v for k, v in sorted(e.decode_batch_sizes.items())},
            "prefix_cache": {"entries": len(e.prefix), "mb": e.prefix.nbytes / 2**20},
            "routing_keys": dict(self.routing_keys),  # requests per router key, most recent 4096
        }
        a = self.args
        return {
            "model_path": a.model,
            "context_length": self.context_len,
            "max_req_input_len": self.context_len - 1,
            "max_running_requests": a.max_running_requests,
            "max_prefill_tokens": a.max_prefill_tokens,
            "scheduler": a.scheduler,
            "enable_deterministic_inference": a.enable_deterministic_inference,
            "enable_return_routed_experts": a.enable_return_routed_experts,
            "skip_tokenizer_init": True,
            "device": a.device,
            "weight_version": self.weight_version,
            "enable_lora": True,  # adapters of any rank and target (SGLang: --enable-lora)
            "loaded_adapters": {n: a.path for n, a in self.lora.loaded.items()},
            "version": "agentrl-devserver",
            "internal_states": [state],
        }


def build_app(server: DevServer, api_key: str | None = None) -> FastAPI:
    """The server's routes; with `api_key`, each but /health wants it as a Bearer token."""

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        await server.start()
        yield
        await server.stop()

    app = FastAPI(lifespan=lifespan, openapi_url=None)

    @app.exception_handler(BadRequest)
    async def bad_request(request: Request, exc: BadRequest) -> JSONResponse:
        return JSONResponse({"error": {"message": str(exc)}}, status_code=400)

    add_generation_routes(app, server)
    add_admin_routes(app, server)
    add_weight_routes(app, server)
    add_lora_routes(app, server)
    if api_key:
        app.add_middleware(BearerAuth, key=api_key)
    return app
