"""What a run checks of its rollout servers: before it starts SGLang, that the checkpoint's
output head will load (`check_head_loads`) and that SGLang's HTTP server has a fast request
parser (`warn_http_parser`); once they answer, that they compute each request apart from the
others when the run is deterministic (`check_deterministic`), and, for servers the user started
(`engine.urls`), whether they decode past their CUDA graphs (`warn_uncaptured`).

SGLang captures decode CUDA graphs up to a batch size (256 on a GPU of 60-160 GiB below TP 4, in
0.5.17) and by default runs as many requests at once as its KV memory holds, far more. A decode
batch past the graph's size runs without a graph: on one H200, 512 episodes of 4 x 128-token
turns made 19.0k tok/s uncapped and 41.2k with `--max-running-requests 256` (docs/scaling.md).
agentrl starts its own servers capped (`EngineConfig.running_cap`); a server the user started is
theirs, so a run only says so, once, when its episodes could fill such a batch.

Read from SGLang's `/server_info`: the decode graph's sizes (`cuda_graph_config.decode`: its `bs`
list or `max_bs`, unless its backend is `disabled`; older servers: `cuda_graph_max_bs` /
`cuda_graph_bs`, off with `disable_cuda_graph`) and `max_running_requests` (the scheduler's, at
the top or in `internal_states`). A server that says neither (the dev server) is never warned of.
"""

from __future__ import annotations

import importlib.util
import json
import logging
from pathlib import Path
from typing import Any

from agentrl.engine.config import DETERMINISTIC
from agentrl.types import ConfigError

log = logging.getLogger(__name__)


def before_launch(model_path: Path, placement: str) -> None:
    """What agentrl checks before it starts SGLang servers on `model_path`."""
    check_head_loads(model_path)
    if placement == "local":  # the servers run in this Python (fleet.server_command)
        warn_http_parser()


def warn_http_parser() -> bool:
    """SGLang serves HTTP with uvicorn, which parses requests with httptools when it is installed
    and else with h11, in pure Python; SGLang does not require httptools. Every turn of every
    episode is a request to that one process, so its parser is on the rollout's path: one H200,
    256 episodes x 4 turns x 128 tokens, a bare client 3.03-3.26 s with httptools against
    3.47-3.73 s with h11 in the same call (docs/benchmarks.md). True: warned."""
    if importlib.util.find_spec("httptools") is not None:
        return False
    log.warning("httptools is not installed: SGLang's HTTP server will parse each request with "
                "h11 (pure Python), a cost every turn of every episode pays. `pip install "
                "httptools` (agentrl[gpu] includes it)")  # fmt: skip
    return True


def decode_graph_batch(info: dict[str, Any]) -> int | None:
    """The largest decode batch `info`'s server runs as a CUDA graph; None: no graphs, or not
    told."""
    if info.get("disable_cuda_graph"):
        return None
    config = info.get("cuda_graph_config")
    decode = config.get("decode") if isinstance(config, dict) else None
    if isinstance(decode, dict):
        if decode.get("backend") == "disabled":
            return None
        sizes, top = decode.get("bs"), decode.get("max_bs")
    else:
        sizes, top = info.get("cuda_graph_bs"), info.get("cuda_graph_max_bs")
    if isinstance(sizes, list) and sizes and all(isinstance(s, int) for s in sizes):
        return max(sizes)
    return top if isinstance(top, int) and top > 0 else None


def max_running(info: dict[str, Any]) -> int | None:
    """The most requests `info`'s server runs at once (its scheduler's cap), None if not told."""
    for where in (info, *(info.get("internal_states") or [])):
        value = where.get("max_running_requests") if isinstance(where, dict) else None
        if isinstance(value, int) and value > 0:
            return value
    return None


def uncaptured(urls: list[str], infos: list[dict[str, Any]], in_flight: int) -> list[str]:
    """One warning per server that may run more than its decode graph's batch: it lets more
    requests run at once than the graph holds, and the run's `in_flight` episodes, spread over
    the servers, could fill more than the graph."""
    per_server = -(-in_flight // max(len(urls), 1))
    out = []
    for url, info in zip(urls, infos, strict=True):
        graph, running = decode_graph_batch(info), max_running(info)
        if graph is None or running is None or running <= graph or per_server <= graph:
            continue
        out.append(
            f"rollout server {url} runs up to {running} requests at once but captures decode "
            f"CUDA graphs up to {graph}: with up to {per_server} episodes in flight on it, decode "
            f"batches past {graph} run without a graph (half the tokens/s at twice the graph's "
            f"batch on an H200, docs/scaling.md). Start it with --max-running-requests {graph}, "
            "as agentrl starts its own servers; the episodes past it wait in its queue"
        )
    return out


async def warn_uncaptured(engine: Any, in_flight: int) -> list[str]:
    """Log `uncaptured`'s warnings for `engine`'s servers (an EngineClient); returns them."""
    infos = await engine.control.server_info()
    found = uncaptured(list(engine.urls), infos, in_flight)
    for line in found:
        log.warning(line)
    return found


async def check_deterministic(engine: Any) -> None:
    """trainer.deterministic: every server computes each request apart from the others (the
    ones we start get the flag; servers given by engine.urls must have been started with it)."""
    infos = await engine.control.server_info()
    off = [url for url, info in zip(engine.urls, infos, strict=True)
           if not info.get("enable_deterministic_inference")]  # fmt: skip
    if off:
        raise ConfigError(
            f"trainer.deterministic=true but the rollout servers {', '.join(off)} were not "
            f"started with {DETERMINISTIC} (the dev server and SGLang both take it): a request's "
            "logprobs would follow the requests batched beside it. Restart them with it, or "
            "drop trainer.deterministic"
        )


# SGLang model classes that always build an output head of their own and never tie it to the
# embedding (sglang/srt/models/qwen2_moe.py and qwen3_moe.py, SGLang 0.5.17)
UNTIED_HEAD_ONLY = frozenset({"Qwen2MoeForCausalLM", "Qwen3MoeForCausalLM"})


def check_head_loads(model_path: Path) -> None:
    """Refuse a checkpoint SGLang would serve with an output head it never loaded: one of
    `UNTIED_HEAD_ONLY` whose head is tied to the embedding and so not in its files. The server
    would start and sample from garbage (an H100 run: 0.26 per token from the trainer's logprobs,
    flagged only by the logprob-gap guard). A path that is no local checkpoint is left to SGLang."""
    try:
        conf = json.loads((Path(model_path) / "config.json").read_text())
    except (OSError, ValueError):
        return
    arch = set(conf.get("architectures") or []) & UNTIED_HEAD_ONLY
    if not arch or not conf.get("tie_word_embeddings"):
        return
    from safetensors import safe_open

    for f in Path(model_path).glob("*.safetensors"):
        with safe_open(str(f), "pt") as st:
            if "lm_head.weight" in st.keys():  # noqa: SIM118 - safe_open has no __contains__
                return
    raise ConfigError(
        f"{model_path}: {sorted(arch)[0]} with tie_word_embeddings=true and no lm_head.weight in "
        "its files: SGLang builds this model's output head apart from the embedding and would "
        "serve it unloaded. Save the checkpoint with its own head (tie_word_embeddings=false, "
        "lm_head.weight written), as every released model of this family is"
    )
