"""The control plane of the rollout servers: health, weight versions, pause, memory, LoRA
adapters and weight updates, each fanned out to every server at once (`Http.fanout`: one
failure fails the call, naming the servers, once every server has answered; the calls that
read each server's answer themselves go through `gather_all`: one failing cancels and awaits the
rest, so no request runs on for nobody). Generation is client.py's.

    await engine.control.wait_healthy()
    await engine.control.update_weights_from_disk("/ckpt/step_10", weight_version="10")
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, Literal

from agentrl.engine.http import FIX_HINT, Http, Server, health_probe
from agentrl.engine.protocol import EngineError, EngineUnavailable
from agentrl.tool import gather_all


class Control:
    """Admin calls over `http`'s servers (the router only answers health)."""

    def __init__(self, http: Http, health_timeout_s: float = 300.0) -> None:
        self.http = http
        self.health_timeout_s = health_timeout_s

    async def health(self, deep: bool = False) -> dict[str, bool]:
        """Per server (and the router): answers its health probe (`health_probe`) with 200."""

        async def one(s: Server) -> bool:
            path, timeout = health_probe(
                deep and s is not self.http.router, self.http.connect_timeout_s
            )
            try:
                r = await self.http.call(s, "GET", path, timeout=timeout)
            except EngineUnavailable:
                return False
            return r.status == 200

        every = [*self.http.servers, *([self.http.router] if self.http.router else [])]
        oks = await gather_all(one(s) for s in every)
        return dict(zip([s.url for s in every], oks, strict=True))

    async def wait_healthy(self, timeout_s: float | None = None, poll_s: float = 0.5) -> None:
        """Block until every server answers /health with 200."""
        deadline = time.monotonic() + (timeout_s or self.health_timeout_s)
        while True:
            status = await self.health()
            down = [u for u, ok in status.items() if not ok]
            if not down:
                for s in self.http.servers:
                    s.down_until = 0.0
                return
            if time.monotonic() >= deadline:
                raise EngineUnavailable(
                    f"engine servers not healthy after {timeout_s or self.health_timeout_s:g}s: "
                    f"{', '.join(down)}; {FIX_HINT}"
                )
            await asyncio.sleep(poll_s)

    async def _get_with_fallback(self, path: str, old_path: str) -> list[Any]:
        try:
            return await self.http.fanout("GET", path)
        except EngineError as e:  # SGLang renamed /get_model_info -> /model_info (2026)
            if "HTTP 404" not in str(e):
                raise
            return await self.http.fanout("GET", old_path)

    async def model_info(self) -> list[dict[str, Any]]:
        return await self._get_with_fallback("/model_info", "/get_model_info")

    async def server_info(self) -> list[dict[str, Any]]:
        return await self._get_with_fallback("/server_info", "/get_server_info")

    async def get_weight_version(self) -> list[str]:
        """Per server, the version its weights carry: /model_info's `weight_version` (SGLang
        0.5.17 answers /get_weight_version with a 404), else the older route."""
        info = await self.model_info()
        if all("weight_version" in r for r in info):
            return [str(r["weight_version"]) for r in info]
        res = await self.http.fanout("GET", "/get_weight_version")
        return [str(r["weight_version"]) for r in res]

    async def update_weight_version(self, new_version: str, abort_all_requests: bool = True):
        body = {"new_version": new_version, "abort_all_requests": abort_all_requests}
        return await self.http.fanout("POST", "/update_weight_version", body)

    async def flush_cache(self) -> list[bool]:
        """True per server that flushed; SGLang refuses (400) while requests are running."""
        rs = await gather_all(self.http.call(s, "POST", "/flush_cache") for s in self.http.servers)
        return [r.status == 200 for r in rs]

    async def pause_generation(self, mode: Literal["abort", "retract", "in_place"] = "abort"):
        return await self.http.fanout("POST", "/pause_generation", {"mode": mode})

    async def continue_generation(self) -> list[Any]:
        return await self.http.fanout("POST", "/continue_generation", {})

    async def load_lora_adapter(self, name: str, path: str) -> list[Any]:
        """Every server loads the PEFT adapter dir `path` as `name` (SGLang: --enable-lora)."""
        return await self.http.fanout(
            "POST", "/load_lora_adapter", {"lora_name": name, "lora_path": str(path)}
        )

    async def unload_lora_adapter(self, name: str) -> list[Any]:
        return await self.http.fanout("POST", "/unload_lora_adapter", {"lora_name": name})

    async def release_memory_occupation(self, tags: list[str] | None = None) -> list[Any]:
        return await self.http.fanout("POST", "/release_memory_occupation", {"tags": tags})

    async def resume_memory_occupation(self, tags: list[str] | None = None) -> list[Any]:
        return await self.http.fanout("POST", "/resume_memory_occupation", {"tags": tags})

    async def update_weights_from_disk(
        self, model_path: str, weight_version: str | None = None, **extra: Any
    ) -> list[Any]:
        """Reload from a checkpoint dir. `extra`: more SGLang fields (load_format, ...)."""
        body = {"model_path": str(model_path), "weight_version": weight_version, **extra}
        return await self.http.fanout("POST", "/update_weights_from_disk", body)

    async def init_weights_update_group(
        self,
        master_address: str,
        master_port: int,
        *,
        group_name: str = "weight_update_group",
        backend: str = "nccl",
        ranks_per_server: int = 1,
    ) -> list[Any]:
        """Every server joins the trainer's group: trainer rank 0, server i ranks from
        1 + i * ranks_per_server. Blocks until the group forms, so the trainer must join
        (rank 0, world_size = 1 + n * ranks_per_server) concurrently."""
        world_size = 1 + len(self.http.servers) * ranks_per_server
        common = {
            "master_address": master_address,
            "master_port": master_port,
            "world_size": world_size,
            "group_name": group_name,
            "backend": backend,
        }
        bodies = [
            {"rank_offset": 1 + i * ranks_per_server, **common}
            for i in range(len(self.http.servers))
        ]
        return await self.http.fanout("POST", "/init_weights_update_group", bodies)

    async def update_weights_from_distributed(
        self,
        names: list[str],
        dtypes: list[Any],
        shapes: list[list[int]],
        *,
        group_name: str = "weight_update_group",
        weight_version: str | None = None,
        **extra: Any,
    ) -> list[Any]:
        """Servers receive `names` by broadcast from rank 0, in this order; the trainer must
        broadcast them concurrently with this call. `extra`: flush_cache, abort_all_requests."""
        body = {
            "names": list(names),
            "dtypes": [str(d).removeprefix("torch.") for d in dtypes],
            "shapes": [list(s) for s in shapes],
            "group_name": group_name,
            "weight_version": weight_version,
            **extra,
        }
        return await self.http.fanout("POST", "/update_weights_from_distributed", body)

    async def destroy_weights_update_group(self, group_name: str = "weight_update_group"):
        return await self.http.fanout(
            "POST", "/destroy_weights_update_group", {"group_name": group_name}
        )

    async def update_weights_from_tensor(
        self,
        serialized_named_tensors: list[str] | list[list[str]],
        weight_version: str | None = None,
        **extra: Any,
    ) -> list[Any]:
        """`serialized_named_tensors`: one payload per server rank (SGLang: per TP rank), or a
        list of such lists, one per server. Dev server payloads: `encode_named_tensors`.
        `extra`: load_format, flush_cache, abort_all_requests."""
        payloads = serialized_named_tensors
        if not (payloads and isinstance(payloads[0], list)):
            payloads = [payloads] * len(self.http.servers)
        common = {"weight_version": weight_version, **extra}
        bodies = [{"serialized_named_tensors": p, **common} for p in payloads]
        return await self.http.fanout("POST", "/update_weights_from_tensor", bodies)
