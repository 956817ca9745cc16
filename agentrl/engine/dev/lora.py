"""LoRA adapters on the dev server, loaded and named the way SGLang serves them.

    POST /load_lora_adapter   {"lora_name": "v3", "lora_path": "/run/adapters/v3"}  # a PEFT dir
    POST /unload_lora_adapter {"lora_name": "v3"}
    POST /generate            {"input_ids": [...], "lora_path": "v3", ...}  # none: the base model

An adapter dir is PEFT's (`PeftModel.save_pretrained`: adapter_config.json and
adapter_model.safetensors). A request that names an adapter samples from W + s B A for every
adapted weight W (s = alpha / r, or alpha / sqrt(r) with rsLoRA). What differs from SGLang,
whose LoRA kernels mix adapters within one batch: here the running batch uses one adapter at a
time. The scheduler admits only requests for the running batch's adapter; when the batch
empties it switches to the next waiting request's adapter by writing base + s B A into the
adapted weights from a kept copy of the base, so the base stays exact after any number of
switches. A switch empties the prefix cache (the KV belongs to the old weights).
"""

from __future__ import annotations

import asyncio
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from safetensors.torch import load_file

from agentrl.engine.dev.request import BadRequest, Req

DevServer = Any  # agentrl.engine.dev.server.DevServer (which imports this module)

_PREFIX = "base_model.model."  # PEFT's prefix before the wrapped model's own names


@dataclass
class Adapter:
    name: str
    path: str
    rank: int
    weights: dict[str, tuple[torch.Tensor, torch.Tensor, float]]  # param -> (A, B, scale)


def read_adapter(name: str, path: str, params: dict[str, torch.Tensor]) -> Adapter:
    """A PEFT LoRA dir, checked against the served model's parameters (names and shapes)."""
    root = Path(path)
    try:
        cfg = json.loads((root / "adapter_config.json").read_text())
    except (OSError, ValueError) as e:
        raise BadRequest(f"cannot load LoRA adapter {name!r} from {path}: {e}") from e
    if not isinstance(cfg, dict):
        raise BadRequest(f"{path}: adapter_config.json is not a JSON object")
    if cfg.get("peft_type", "LORA") != "LORA" or cfg.get("use_dora"):
        raise BadRequest(f"{path}: only plain LoRA adapters are served (not DoRA or other PEFT)")
    if cfg.get("modules_to_save") or cfg.get("fan_in_fan_out"):
        raise BadRequest(f"{path}: adapters with modules_to_save or fan_in_fan_out are not served")
    try:
        r, alpha = int(cfg["r"]), float(cfg.get("lora_alpha", cfg["r"]))
    except (KeyError, TypeError, ValueError) as e:
        raise BadRequest(f"{path}: adapter_config.json needs an integer r ({e!r})") from e
    if r < 1:
        raise BadRequest(f"{path}: LoRA rank r={r} must be >= 1")
    try:
        raw = load_file(str(root / "adapter_model.safetensors"))
    except (OSError, ValueError) as e:
        raise BadRequest(f"cannot load LoRA adapter {name!r} from {path}: {e}") from e
    scale = alpha / math.sqrt(r) if cfg.get("use_rslora") else alpha / r
    pairs: dict[str, dict[str, torch.Tensor]] = {}
    for key, t in raw.items():
        for part in ("lora_A", "lora_B"):
            if f".{part}." in key:
                target = key.removeprefix(_PREFIX).replace(f".{part}.", ".")
                pairs.setdefault(target, {})[part] = t
                break
        else:
            raise BadRequest(f"{path}: unexpected tensor {key!r} (only lora_A / lora_B weights)")
    weights = {}
    for target, ab in sorted(pairs.items()):
        a, b = ab.get("lora_A"), ab.get("lora_B")
        if a is None or b is None:
            raise BadRequest(f"{path}: {target} has only one of lora_A / lora_B")
        if target not in params:
            raise BadRequest(f"{path}: {target} is not a parameter of the served model")
        want = tuple(params[target].shape)
        if (
            a.ndim != 2
            or b.ndim != 2
            or (b.shape[0], a.shape[1]) != want
            or a.shape[0] != b.shape[1]
        ):
            raise BadRequest(
                f"{path}: {target}: B {list(b.shape)} @ A {list(a.shape)} does not make {list(want)}"
            )
        weights[target] = (a.float(), b.float(), scale)
    if not weights:
        raise BadRequest(f"{path}: the adapter has no tensors")
    return Adapter(name, str(path), r, weights)


def pick(waiting: list[Req], lora: str | None, slots: int, max_tokens: int) -> list[Req]:
    """The waiting requests that join the batch, in order: those for adapter `lora`, at most
    `slots` of them, within `max_tokens` of prefill (the first always)."""
    new: list[Req] = []
    tokens = 0
    for r in waiting:
        if len(new) >= slots:
            break
        if r.lora != lora:
            continue
        n = len(r.prompt) + len(r.out)
        if new and tokens + n > max_tokens:
            break
        new.append(r)
        tokens += n
    return new


class Adapters:
    """The loaded adapters, the one the model's weights hold now, and the base they replaced."""

    def __init__(self) -> None:
        self.loaded: dict[str, Adapter] = {}
        self.active: str | None = None  # None: the model holds the base weights
        self.base: dict[str, torch.Tensor] = {}  # base copies of the weights an adapter changed
        self.unloading: set[str] = set()  # no new request may name these

    @property
    def names(self) -> frozenset[str]:
        return frozenset(self.loaded) - self.unloading

    def add(self, adapter: Adapter) -> None:
        if adapter.name in self.loaded:
            raise BadRequest(
                f"Failed to load LoRA adapter {adapter.name} because it is already loaded"
            )
        self.loaded[adapter.name] = adapter

    def remove(self, name: str) -> Adapter:
        if name not in self.loaded:
            raise BadRequest(f"LoRA adapter {name!r} is not loaded")
        return self.loaded.pop(name)

    @torch.no_grad()
    def activate(self, model: torch.nn.Module, name: str | None) -> bool:
        """Make the model's weights base + the adapter `name`'s (None: the base). Returns whether
        any weight changed."""
        if name == self.active:
            return False
        params = dict(model.named_parameters())
        for n, base in self.base.items():  # the base back where the last adapter was
            params[n].copy_(base)
        if name is not None:
            for n, (a, b, scale) in self.loaded[name].weights.items():
                p = params[n]
                if n not in self.base:
                    self.base[n] = p.detach().clone()
                p.copy_((self.base[n].float() + scale * (b @ a)).to(p.dtype))
        self.active = name
        return True

    def switch(self, engine: Any, name: str | None) -> None:
        """In the scheduler's thread, with no batch running: serve `name` (None: the base)."""
        if self.activate(engine.model, name):
            engine.weights_changed()

    def rebase(self, model: torch.nn.Module | None) -> None:
        """Before the base weights change (a weight update): the model gets its base back
        (`model` None: it is being replaced) and the kept copies are dropped."""
        if model is not None:
            self.activate(model, None)
        self.base.clear()
        self.active = None


async def load(server: DevServer, body: dict) -> dict[str, Any]:
    name, path = body.get("lora_name"), body.get("lora_path")
    if not (isinstance(name, str) and name and isinstance(path, str) and path):
        raise BadRequest("lora_name and lora_path (a PEFT adapter dir) are required")
    params = dict(server.engine.model.named_parameters())
    server.lora.add(await asyncio.to_thread(read_adapter, name, path, params))
    return {"success": True, "error_message": None, "loaded_adapters": _loaded(server)}


async def unload(server: DevServer, body: dict) -> dict[str, Any]:
    """As SGLang: new requests may no longer name it; the ones that do finish first."""
    name = body.get("lora_name")
    if not isinstance(name, str) or name not in server.lora.names:
        raise BadRequest(f"LoRA adapter {name!r} is not loaded")
    server.lora.unloading.add(name)
    try:
        while any(r.lora == name for r in server.inflight.values()):
            await asyncio.sleep(0.01)
        async with server.model_lock:
            if server.lora.active == name:
                await asyncio.to_thread(server.lora.switch, server.engine, None)
            server.lora.remove(name)
    finally:
        server.lora.unloading.discard(name)
    return {"success": True, "error_message": None, "loaded_adapters": _loaded(server)}


def _loaded(server: DevServer) -> dict[str, str]:
    return {n: a.path for n, a in server.lora.loaded.items()}


def add_lora_routes(app: FastAPI, server: DevServer) -> None:
    """SGLang's LoRA routes; their answers are SGLang's LoRAUpdateOutput (400 on failure)."""

    def route(fn):
        async def handle(request: Request) -> JSONResponse:
            try:
                body = await request.json()
                if not isinstance(body, dict):
                    raise BadRequest("the body must be a JSON object")
                return JSONResponse(await fn(server, body))
            except (BadRequest, ValueError) as e:
                body = {
                    "success": False,
                    "error_message": str(e),
                    "loaded_adapters": _loaded(server),
                }
                return JSONResponse(body, status_code=400)

        return handle

    async def from_tensors(server: DevServer, body: dict) -> dict[str, Any]:
        raise BadRequest(
            "the dev server loads adapters from a PEFT dir: use /load_lora_adapter with lora_path"
        )

    app.add_api_route("/load_lora_adapter", route(load), methods=["POST"])
    app.add_api_route("/unload_lora_adapter", route(unload), methods=["POST"])
    app.add_api_route("/load_lora_adapter_from_tensors", route(from_tensors), methods=["POST"])
