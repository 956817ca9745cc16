"""SGLang's HTTP wire format as agentrl uses it: sampling params, /generate responses (with
logprobs), error bodies, and the errors they become. `agentrl.engine` is the client that sends
them; `agentrl.engine.dev` answers in the same format.

Stop tokens (SGLang >= 0.5: scheduler_output_processor_mixin.py, detokenizer_manager.py,
tokenizer_manager.py): the scheduler appends each sampled id to `req.output_ids` before checking
stop conditions and returns `output_ids_through_stop`, stop position included. `no_stop_trim` is
read only by the detokenizer's `trim_matched_stop`, which trims the *text* (and the ids it decodes
it from), never the response's `output_ids`; with `--skip-tokenizer-init` there is no text. So
`output_ids` ends with the matched stop id (finish_reason {"type": "stop", "matched": id}) and
`output_token_logprobs` has one entry per output id. We still send `no_stop_trim=True` (the
rollout trains on the stop token), and should a server drop it from `output_ids`, we restore it
from the logprob entries, which carry the ids. Also mirrored by the dev server: `max_new_tokens`
is checked before stop tokens (a stop id sampled as the last allowed token finishes "length"),
and `ignore_eos=True` turns off every token stop, `stop_token_ids` included.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass
from operator import itemgetter
from typing import Any

import orjson
from pydantic import BaseModel, ConfigDict, Field

from agentrl.types import Completion, FinishReason

ROUTING_KEY_HEADER = "x-smg-routing-key"  # smg's consistent hashing reads the key from it

_CONTEXT_MARKERS = ("context length", "maximum context length", "requested token count exceeds")


class EngineError(RuntimeError):
    """Base class of engine client errors."""


class EngineUnavailable(EngineError):
    """No server answered (connection refused, dropped, timed out or 5xx) after all retries."""


class EngineProtocolError(EngineError):
    """A server answered with a body this client cannot read as an SGLang response."""


class EngineRequestError(EngineError):
    """The server rejected the request (4xx). Not retried: the same request fails anywhere."""

    def __init__(self, message: str, status_code: int = 400, server: str = ""):
        super().__init__(message)
        self.status_code = status_code
        self.server = server


class PromptTooLong(EngineRequestError):
    """prompt (+ max_new_tokens) does not fit the model's context length: HTTP 400 from SGLang."""


class SamplingParams(BaseModel):
    """Per-request sampling settings, sent as SGLang `sampling_params`.

    temperature 0 means greedy. top_k -1 disables top-k. `seed` becomes SGLang's
    `sampling_seed` (reproducible sampling for one request). The penalties are neutral unless
    set (only `agentrl gateway` under rollout.gateway.sampling=request sets them: training
    samples what the learner scores), and always sent (see `to_sglang`)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_new_tokens: int = Field(256, ge=0)
    temperature: float = Field(1.0, ge=0)
    top_p: float = Field(1.0, gt=0, le=1)
    top_k: int = Field(-1, ge=-1)
    min_p: float = Field(0.0, ge=0, le=1)
    stop_token_ids: list[int] = Field(default_factory=list)
    ignore_eos: bool = False
    seed: int | None = None
    presence_penalty: float = Field(0.0, ge=-2, le=2)
    frequency_penalty: float = Field(0.0, ge=-2, le=2)
    repetition_penalty: float = Field(1.0, gt=0, le=2)

    def to_sglang(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "max_new_tokens": self.max_new_tokens,
            "temperature": self.temperature,
            "top_p": self.top_p,
            "top_k": self.top_k,
            "min_p": self.min_p,
            "ignore_eos": self.ignore_eos,
            # Always sent (neutral unless set): SGLang fills unset keys from the model's
            # generation_config.json (`--sampling-defaults model`), and a repetition penalty
            # there would make the engine sample from a distribution the trainer never sees.
            "frequency_penalty": self.frequency_penalty,
            "presence_penalty": self.presence_penalty,
            "repetition_penalty": self.repetition_penalty,
            "no_stop_trim": True,  # we train on the stop token: keep it (see module docstring)
            "skip_special_tokens": False,
        }
        if self.stop_token_ids:
            out["stop_token_ids"] = list(self.stop_token_ids)
        if self.seed is not None:
            out["sampling_seed"] = self.seed
        return out


@dataclass
class Reply:
    """One HTTP answer, read whole (status and body bytes)."""

    status: int
    body: bytes

    @property
    def text(self) -> str:
        return self.body.decode("utf-8", "replace")

    def json(self) -> Any:
        """The body as JSON; ValueError when it is not JSON."""
        return orjson.loads(self.body)


def error_message(response: Reply) -> str:
    """The message of an SGLang error body ({"error": {"message"}} or {"message"}), else text."""
    try:
        body = response.json()
    except ValueError:
        return response.text.strip()[:500]
    if isinstance(body, dict):
        err = body.get("error")
        if isinstance(err, dict) and "message" in err:
            return str(err["message"])
        for k in ("message", "error_message", "detail"):  # error_message: the LoRA routes
            if k in body:
                return str(body[k])
    return str(body)[:500]


_LOGPROB, _ID = itemgetter(0), itemgetter(1)  # an output_token_logprobs entry: [logprob, id, text]


def _all_of(values: Any, kind: type) -> bool:
    """Whether `values` is a list of values of type `kind` exactly (not bool for int)."""
    return type(values) is list and set(map(type, values)) <= {kind}


def parse_generate_response(data: dict[str, Any], server: str = "", latency_s: float = 0.0):
    """One SGLang /generate response (return_logprob=True) -> Completion."""
    try:
        meta = data["meta_info"]
        out = data["output_ids"]
        if not _all_of(out, int):  # as orjson reads JSON integers: kept, not converted
            out = [int(t) for t in out]
        fr = meta.get("finish_reason") or {}
        finish = FinishReason(fr.get("type"))
    except (KeyError, TypeError, ValueError) as e:
        raise EngineProtocolError(f"{server}: not an SGLang /generate response ({e!r})") from e
    entries = meta.get("output_token_logprobs")
    if entries is None:
        raise EngineProtocolError(f"{server}: no output_token_logprobs; send return_logprob=True")
    lp_ids = list(map(_ID, entries))
    if lp_ids != out:  # (equal: each is a number equal to `out`'s int, which int() gives)
        lp_ids = [int(t) for t in lp_ids]
    logprobs = list(map(_LOGPROB, entries))
    if not _all_of(logprobs, float):
        logprobs = [float(x) for x in logprobs]
    matched = fr.get("matched")
    matched = matched if isinstance(matched, int) and not isinstance(matched, bool) else None
    if lp_ids != out:
        if matched is not None and lp_ids[:-1] == out and lp_ids[-1] == matched:
            out = lp_ids  # a server trimmed the stop token from output_ids: restore it
        elif finish is FinishReason.ABORT and lp_ids == out[: len(lp_ids)]:
            out = out[: len(lp_ids)]
        else:
            raise EngineProtocolError(
                f"{server}: output_ids ({len(out)}) and output_token_logprobs ({len(lp_ids)}) "
                "disagree"
            )
    return Completion(
        token_ids=out,
        logprobs=logprobs,
        finish_reason=finish,
        weight_version=str(meta.get("weight_version", "")),
        prompt_tokens=int(meta.get("prompt_tokens", 0)),
        cached_tokens=int(meta.get("cached_tokens", 0) or 0),
        matched_stop=matched,
        server=server,
        latency_s=latency_s,
        routed_experts=routed_experts(meta.get("routed_experts"), server),
    )


def routed_experts(blob: Any, server: str = "") -> Any:
    """SGLang's `meta_info.routed_experts` (a request with return_routed_experts, a server with
    --enable-return-routed-experts): base64 of int32 expert ids, position-major (prompt + output
    ids but the last, each MoE layer, each routed expert) -> a flat int32 numpy array; None when
    absent. The learner shapes it by its model's layers and experts per token."""
    if blob is None:
        return None
    import numpy as np  # lazy: the client imports no numpy otherwise

    try:
        return np.frombuffer(base64.b64decode(blob), dtype=np.int32)
    except (ValueError, TypeError) as e:
        raise EngineProtocolError(f"{server}: routed_experts is not base64 of int32 ({e})") from e


def encode_routed_experts(ids: Any) -> str:
    """The inverse of `routed_experts`, as the dev server answers it."""
    import numpy as np

    return base64.b64encode(np.ascontiguousarray(ids, dtype=np.int32).tobytes()).decode("ascii")


def request_error(r: Reply, url: str, path: str) -> EngineRequestError:
    msg = error_message(r)
    text = f"{url}{path}: HTTP {r.status}: {msg}"
    if r.status == 400 and any(m in msg.lower() for m in _CONTEXT_MARKERS):
        return PromptTooLong(text, r.status, url)
    return EngineRequestError(text, r.status, url)


def encode_named_tensors(named_tensors: dict[str, Any]) -> str:
    """CPU-friendly payload for `update_weights_from_tensor` on the dev server.

    SGLang's own format is a pickled dict of CUDA-IPC handles, which has no meaning on CPU; the
    dev server takes base64 of safetensors bytes instead (`load_format="safetensors"`)."""
    from safetensors.torch import save  # lazy: keep torch out of the client import

    tensors, seen = {}, set()
    for k, v in named_tensors.items():
        t = v.detach().to("cpu").contiguous()
        if t.data_ptr() in seen:  # tied weights share storage; safetensors wants copies
            t = t.clone()
        seen.add(t.data_ptr())
        tensors[k] = t
    return base64.b64encode(save(tensors)).decode("ascii")
