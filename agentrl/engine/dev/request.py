"""One generation request of the dev server (agentrl/engine/dev/server.py): what it is (`Req`),
how a /generate body becomes requests (checked against `Limits` as SGLang checks them; a bad one
is a `BadRequest`, answered with HTTP 400 and SGLang's error body), and how a finished one is
answered (`response`, `abort_reason`). Also the admin bodies' tensors and dtypes. No model and
no HTTP here: the scheduler is agentrl/engine/dev/batch.py, the routes routes.py."""

from __future__ import annotations

import asyncio
import base64
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

import torch

from agentrl.engine.protocol import encode_routed_experts

UNSUPPORTED = {  # SGLang sampling params that need a tokenizer, or are not built: key -> neutral
    "stop": None, "stop_regex": None, "regex": None, "json_schema": None, "ebnf": None,
    "structural_tag": None, "min_new_tokens": 0, "n": 1, "logit_bias": None,
}  # fmt: skip
PENALTIES = {  # SGLang's ranges (repetition 0 would divide by it): key -> (neutral, check, says)
    "frequency_penalty": (0.0, lambda v: -2 <= v <= 2, "from -2 to 2"),
    "presence_penalty": (0.0, lambda v: -2 <= v <= 2, "from -2 to 2"),
    "repetition_penalty": (1.0, lambda v: 0 < v <= 2, "above 0 and at most 2"),
}


@dataclass
class Limits:
    """What a request is validated against."""

    vocab_size: int
    context_len: int
    inflight: dict[str, Any]
    adapters: frozenset[str] = frozenset()  # LoRA adapters a request may name (dev/lora.py)
    routed_experts: bool = False  # --enable-return-routed-experts


class BadRequest(ValueError):
    """Answered with HTTP 400 and SGLang's error body."""


@dataclass
class Req:
    """One generation request (one item of a batch /generate)."""

    rid: str
    prompt: list[int]
    max_new_tokens: int
    temperature: float
    top_p: float
    top_k: int
    min_p: float
    stop_ids: frozenset[int]
    ignore_eos: bool
    return_logprob: bool
    gen: torch.Generator | None
    fut: asyncio.Future
    out: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    finish: dict[str, Any] | None = None
    abort: str | None = None  # set on the event loop; the scheduler drops the row
    version: str | None = None  # the weight version when it finished (a push may follow)
    t0: float = field(default_factory=time.monotonic)
    cached: int = 0  # prompt tokens the prefix cache held at its prefill
    epoch: int = -1  # the engine's weights epoch when its KV was computed
    lora: str | None = None  # the LoRA adapter it samples with (`lora_path`); None: the base
    routed: bool = False  # return_routed_experts: answer with each position's experts
    routes: Any = None  # [prompt + out[:-1], layers * k] int32, once finished (routed)
    # SGLang's penalties, over the ids this request sampled (batch.py: `penalized`)
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    repetition_penalty: float = 1.0

    @property
    def penalized(self) -> bool:
        neutral = self.frequency_penalty == self.presence_penalty == 0.0
        return not neutral or self.repetition_penalty != 1.0


def parse_generate(body: Any, limits: Limits) -> tuple[list[Req], bool]:
    """A /generate body -> requests, and whether the answer is one dict (not a list)."""
    if not isinstance(body, dict):
        raise BadRequest("the body must be a JSON object")
    if body.get("text") is not None:
        raise BadRequest(
            "the dev server has no tokenizer (like --skip-tokenizer-init): send input_ids"
        )
    if body.get("stream"):
        raise BadRequest("stream=True is not supported by the dev server")
    ids = body.get("input_ids")
    if not isinstance(ids, list) or not ids:
        raise BadRequest("input_ids must be a non-empty list of token ids (or of such lists)")
    single = not isinstance(ids[0], list)
    items = [ids] if single else ids
    n = len(items)
    sps = _per_item(body.get("sampling_params") or {}, n, "sampling_params", dict)
    rids = _per_item(body.get("rid"), n, "rid", str)
    logprob = _per_item(body.get("return_logprob", False), n, "return_logprob", bool)
    loras = _loras(body.get("lora_path"), n, limits.adapters)
    routed = _per_item(body.get("return_routed_experts", False), n, "return_routed_experts", bool)
    if any(routed) and not limits.routed_experts:
        raise BadRequest(
            "return_routed_experts needs a mixture-of-experts model and the server started with "
            "--enable-return-routed-experts"
        )
    try:
        reqs = [make_req(limits, *a) for a in zip(items, sps, rids, logprob, strict=True)]
    except (TypeError, ValueError, AttributeError) as e:
        if isinstance(e, BadRequest):
            raise
        raise BadRequest(f"malformed /generate request: {type(e).__name__}: {e}") from e
    for r, lora, routes in zip(reqs, loras, routed, strict=True):
        r.lora, r.routed = lora, routes
    return reqs, single


def _per_item(value: Any, n: int, name: str, kind: type) -> list[Any]:
    if isinstance(value, list):
        if len(value) != n:
            raise BadRequest(f"{name} has {len(value)} entries for {n} inputs")
        return value
    if value is not None and kind is str and n > 1:
        raise BadRequest(f"a batch of {n} inputs needs a list of {n} rids")
    return [value] * n


def _loras(value: Any, n: int, loaded: frozenset[str]) -> list[str | None]:
    """`lora_path`: one adapter name for every input, or one per input (None: the base model)."""
    names = value if isinstance(value, list) else [value] * n
    if len(names) != n or not all(x is None or isinstance(x, str) for x in names):
        raise BadRequest(f"lora_path must be a name or a list of {n} names (or nulls)")
    missing = sorted({x for x in names if x is not None} - loaded)
    if missing:  # SGLang's wording
        raise BadRequest(
            f"The following requested LoRA adapters are not loaded: {', '.join(missing)}\n"
            f"Loaded adapters: {', '.join(sorted(loaded)) or 'none'}."
        )
    return names


def make_req(limits: Limits, ids: Any, sp: dict, rid: str | None, logprob: bool) -> Req:
    if not isinstance(ids, list) or not ids or not all(isinstance(t, int) for t in ids):
        raise BadRequest("each input_ids entry must be a non-empty list of ints")
    if any(t < 0 or t >= limits.vocab_size for t in ids):
        raise BadRequest(
            f"The input_ids contains values outside the vocab size ({limits.vocab_size})."
        )
    n, ctx = len(ids), limits.context_len
    if n >= ctx:
        raise BadRequest(
            f"The input ({n} tokens) is longer than the model's context length ({ctx} tokens)."
        )
    max_new = int(sp.get("max_new_tokens", 128))
    if max_new < 0:
        raise BadRequest("max_new_tokens must be >= 0")
    if max_new + n >= ctx:
        raise BadRequest(
            f"Requested token count exceeds the model's maximum context length of {ctx} "
            f"tokens. You requested a total of {max_new + n} tokens: {n} tokens from the "
            f"input messages and {max_new} tokens for the completion. Please reduce the "
            "number of tokens in the input messages or the completion to fit within the limit."
        )
    for k, neutral in UNSUPPORTED.items():
        if sp.get(k) not in (None, neutral, [], ""):
            raise BadRequest(f"sampling_params.{k} is not supported by the dev server")
    temperature, top_p = float(sp.get("temperature", 1.0)), float(sp.get("top_p", 1.0))
    top_k, min_p = int(sp.get("top_k", -1)), float(sp.get("min_p", 0.0))
    if temperature < 0 or not 0 < top_p <= 1 or not (top_k == -1 or top_k >= 1):
        raise BadRequest("need temperature >= 0, 0 < top_p <= 1, top_k == -1 or >= 1")
    if not 0 <= min_p <= 1:
        raise BadRequest("need 0 <= min_p <= 1")
    rid = rid or uuid.uuid4().hex
    if rid in limits.inflight:
        raise BadRequest(f"Duplicate request ID {rid!r}")
    seed = sp.get("sampling_seed")
    return Req(
        rid=rid,
        prompt=list(ids),
        max_new_tokens=max_new,
        temperature=temperature,
        top_p=top_p,
        top_k=top_k,
        min_p=min_p,
        stop_ids=frozenset(int(t) for t in sp.get("stop_token_ids") or ()),
        ignore_eos=bool(sp.get("ignore_eos", False)),
        return_logprob=logprob,
        gen=None if seed is None else torch.Generator().manual_seed(int(seed)),
        fut=asyncio.get_running_loop().create_future(),
        **penalties_of(sp),
    )


def penalties_of(sp: dict) -> dict[str, float]:
    """The request's frequency, presence and repetition penalties, each within SGLang's range."""
    out = {}
    for key, (neutral, inside, says) in PENALTIES.items():
        v = sp.get(key)
        v = neutral if v is None else float(v)
        if not inside(v):  # NaN too
            raise BadRequest(f"sampling_params.{key} must be {says}, got {v}")
        out[key] = v
    return out


def response(r: Req, weight_version: str) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "id": r.rid,
        "finish_reason": r.finish,
        "prompt_tokens": len(r.prompt),
        "weight_version": r.version or weight_version,
        "completion_tokens": len(r.out),
        "cached_tokens": r.cached,
        "e2e_latency": time.monotonic() - r.t0,
    }
    if r.return_logprob:
        meta["output_token_logprobs"] = [
            [lp, t, None] for lp, t in zip(r.logprobs, r.out, strict=True)
        ]
    if r.routes is not None:  # SGLang's form: base64 of int32, position-major
        meta["routed_experts"] = encode_routed_experts(r.routes.numpy())
    return {"output_ids": list(r.out), "meta_info": meta}


def abort_reason(message: str | None) -> dict[str, Any]:
    return {"type": "abort", "message": message or "aborted", "status_code": None, "err_type": None}


def decode_named_tensors(payload: str) -> dict[str, torch.Tensor]:
    from safetensors.torch import load

    try:
        return dict(load(base64.b64decode(payload)))
    except Exception as e:
        raise BadRequest(
            "serialized_named_tensors entries must be base64 safetensors bytes on the dev server "
            f"(agentrl.engine.protocol.encode_named_tensors), not CUDA-IPC handles: {e}"
        ) from e


def torch_dtype(name: str) -> torch.dtype:
    dt = getattr(torch, str(name).removeprefix("torch."), None)
    if not isinstance(dt, torch.dtype):
        raise BadRequest(f"unknown dtype {name!r} (use e.g. 'float32', 'bfloat16')")
    return dt
