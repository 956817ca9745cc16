"""`learner.offload=auto`: what of the learner's state leaves the GPU while a colocated engine
samples, chosen from the GPU's memory instead of guessed.

While the engine samples, the learner does not compute, so what it keeps on the GPU is state:
per parameter, sharded over the FSDP ranks, fp32 master weights (4 bytes), gradients (4, counted
although they are freed after each step: the allocator's cache often keeps them) and Adam's two
moments (8). `none` keeps all 16 bytes, `optimizer` moves the moments (8 stay), `all` moves
everything (0 stay). Frozen weights (a reference, LoRA's base) are weights only, kept in bf16
when the learner computes in bf16 (2, 2, 0; fp32: 4, 4, 0).

The engine takes `--mem-fraction-static` of the GPU's total memory for weights and KV cache, plus
its own overhead (CUDA context, graphs, activations), counted in `RESERVE_BYTES`. `auto` picks the
first of none → optimizer → all whose resident state fits beside the engine in the memory the
learner measured as available (free, plus what its own ranks hold already).
"""

from __future__ import annotations

from dataclasses import dataclass

GB = 1024**3
RESERVE_BYTES = 4 * GB  # the engine's memory beyond its static fraction, and CUDA contexts
MODES = ("none", "optimizer", "all")
RESIDENT_BYTES = {"none": 16, "optimizer": 8, "all": 0}  # per trained parameter, by mode


@dataclass(frozen=True)
class OffloadChoice:
    mode: str
    learner_bytes: float  # state left on each GPU beside the engine with this mode
    engine_bytes: float
    available_bytes: float

    def describe(self) -> str:
        return (
            f"learner.offload=auto chose {self.mode}: learner state on the GPU "
            f"{self.learner_bytes / GB:.1f} GiB + engine {self.engine_bytes / GB:.1f} GiB "
            f"(+{RESERVE_BYTES / GB:.0f} GiB reserve) of {self.available_bytes / GB:.1f} GiB "
            "measured available"
        )


def choose_offload(
    params: list[tuple[int, bool]],
    ranks: int,
    available_bytes: float,
    total_bytes: float,
    engine_fraction: float,
    frozen_bytes: int = 2,
) -> OffloadChoice:
    """`params`: (parameter count, trains?) per learner role on the GPU, sharded over `ranks`;
    `frozen_bytes`: the element size frozen weights are kept in (bf16: 2)."""
    engine = engine_fraction * total_bytes
    for mode in MODES:
        resident = resident_bytes(params, mode, frozen_bytes)
        choice = OffloadChoice(mode, resident / ranks, engine, available_bytes)
        if choice.learner_bytes + engine + RESERVE_BYTES <= available_bytes:
            break
    return choice  # at worst all: nothing of the learner stays; the engine alone must fit


def update_overflow(
    params: list[tuple[int, bool]], ranks: int, total_bytes: float, frozen_bytes: int = 2
) -> str:
    """Why the learner's update cannot fit a GPU of `total_bytes` (empty when it can): at the
    update every rank holds its whole state — 16 bytes per trained parameter (weights, gradients,
    Adam's moments), frozen weights as stored, sharded over `ranks` — whatever `learner.offload`
    moves out while the engine samples, plus `RESERVE_BYTES`; activations come on top. A run
    this says no to would sample a whole step and then run out of memory in its first update."""
    need = resident_bytes(params, "none", frozen_bytes) / ranks
    if need + RESERVE_BYTES <= total_bytes:
        return ""
    return (
        f"the learner's update needs {need / GB:.1f} GiB of state on each GPU (16 bytes per "
        f"trained parameter: weights, gradients, Adam's moments; over {ranks} rank(s)) plus "
        f"{RESERVE_BYTES / GB:.0f} GiB of reserve and its activations, and a GPU has "
        f"{total_bytes / GB:.1f} GiB: it cannot fit, whatever learner.offload moves out while the "
        "engine samples. Train LoRA adapters (learner.lora.rank), spread the learner over more "
        "GPUs (learner.num_workers) or take a smaller model"
    )


def resident_bytes(params: list[tuple[int, bool]], mode: str, frozen_bytes: int = 2) -> float:
    """Bytes of learner state `mode` keeps on the GPUs while the engine samples, summed over the
    ranks: RESIDENT_BYTES per trained parameter, frozen weights unless `all` moves them too."""
    frozen = 0 if mode == "all" else frozen_bytes
    return float(sum(n * (RESIDENT_BYTES[mode] if trains else frozen) for n, trains in params))


def host_bytes(params: list[tuple[int, bool]], mode: str, frozen_bytes: int = 2) -> float:
    """Bytes of learner state `mode` moves to host memory while the engine samples, summed over
    the ranks (their shards add up to the whole): what `none` keeps less what `mode` keeps.
    Pinned, so the host must hold them in RAM: torch's caching host allocator rounds each block
    up to a power of two (1-2x this)."""
    return resident_bytes(params, "none", frozen_bytes) - resident_bytes(params, mode, frozen_bytes)


def host_available_bytes(meminfo: str = "/proc/meminfo") -> float:
    """This host's memory available to new allocations (Linux MemAvailable); inf where unknown."""
    try:
        with open(meminfo) as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return float(line.split()[1]) * 1024  # kB
    except OSError:
        pass
    return float("inf")


def check_host(mode: str, moved: dict[str, float], available: dict[str, float]) -> tuple[str, str]:
    """(error, warning) for the hosts' memory against what `learner.offload=mode` moves to them
    (`moved` and `available` bytes per host name): an error when a host's available memory
    cannot hold it even unrounded (the first offload would fail mid-run), a warning when the
    power-of-two rounding could take it past; empty strings when it fits."""
    error = warning = ""
    for host, need in sorted(moved.items()):
        have = available.get(host, 0.0)
        what = (
            f"learner.offload={mode} moves {need / GB:.1f} GiB of learner state to host {host}'s "
            f"memory while the engine samples (pinned; up to {2 * need / GB:.1f} GiB with torch's "
            f"power-of-two rounding), and it has {have / GB:.1f} GiB available"
        )
        if need > have:
            error = (
                f"{what}. Train LoRA adapters (learner.lora.rank), spread the learner over more "
                "GPUs (learner.num_workers), run the engine on GPUs of its own "
                "(engine.colocate=false) or take a smaller model"
            )
        elif 2 * need > have:
            warning = f"{what}: the run may run out of host memory at an offload"
    return error, warning


def engine_fraction(extra_args: list[str], default: float = 0.9) -> float:
    """SGLang's `--mem-fraction-static` from engine.extra_args (`--flag V` or `--flag=V`); its
    own default depends on the GPU (up to ~0.9), so a missing flag counts as 0.9."""
    for i, a in enumerate(extra_args):
        if a == "--mem-fraction-static" and i + 1 < len(extra_args):
            return float(extra_args[i + 1])
        if a.startswith("--mem-fraction-static="):
            return float(a.split("=", 1)[1])
    return default


# ---------------------------------------------------------------------------------------------
# learner.activation_checkpointing=auto: how many transformer blocks to recompute in backward


def block_activation_bytes(config: object, elem_bytes: int = 2, kernels: str = "off") -> int:
    """Activations one token keeps through one transformer block for backward, estimated from the
    model's shape and the kernels the block runs (`learner.fused_kernels`'s result).

    - `off` (torch's ops): about 10 hidden-wide tensors (each norm's fp32 input counts twice, its
      output, q after the rotary embedding, attention out), the keys and values, and 4 MLP-wide
      ones (gate, up, the activated gate, their product). At Qwen2.5-1.5B 104 KB; transformers'
      block saves 103.5 KB (tests/unit/test_checkpointing.py counts its saved tensors), and an
      H200 update that kept 23 of 28 blocks of 47k-token micro-batches ran out of memory at
      113 GB of activations: 104.5 KB per token and kept block.
    - `liger`: liger-kernel's RMSNorm keeps only its input and an fp32 scale per row, its SwiGLU
      keeps gate and up (the product is recomputed), its rotary embedding nothing per token: 5
      hidden-wide, 2 key/value-wide and 3 MLP-wide tensors, 70 KB at 1.5B (counted the same way
      with stand-ins that save what liger 0.8.5's kernels save). Planning a liger block at the
      eager size recomputed blocks it did not need to."""
    hidden = int(config.hidden_size)  # type: ignore[attr-defined]
    inter = int(getattr(config, "intermediate_size", 4 * hidden))
    h = heads_of(config)
    kv = h.num_kv_heads * h.head_dim
    if kernels == "liger":  # + the norms' fp32 scales and attention's fp32 log-sum-exp per head
        return elem_bytes * (5 * hidden + 2 * kv + 3 * inter) + 8 + 4 * h.num_heads
    return elem_bytes * (10 * hidden + 4 * kv + 4 * inter)


@dataclass(frozen=True)
class Heads:
    num_heads: int  # H: query heads
    num_kv_heads: int  # K
    head_dim: int  # d


def heads_of(config: object) -> Heads:
    """The attention heads of a transformers config (Llama/Qwen/Mistral names)."""
    h = int(config.num_attention_heads)  # type: ignore[attr-defined]
    k = int(getattr(config, "num_key_value_heads", None) or h)
    d = getattr(config, "head_dim", None) or config.hidden_size // h  # type: ignore[attr-defined]
    return Heads(h, k, int(d))


def blocks_to_checkpoint(
    n_blocks: int,
    tokens: int,
    per_block_bytes: int,
    input_bytes: int,
    budget_bytes: float,
) -> int:
    """The fewest of `n_blocks` to recompute in backward so that a micro-batch of `tokens` fits
    `budget_bytes` of activations: a kept block holds `per_block_bytes` per token, a recomputed one
    only its input (`input_bytes` per token), and one block's activations are rebuilt at a time
    during backward. All of them when even that does not fit (the budget is an estimate)."""
    if tokens <= 0 or n_blocks <= 0:
        return 0
    rebuilt = tokens * per_block_bytes
    kept_extra = tokens * max(per_block_bytes - input_bytes, 1)
    room = budget_bytes - rebuilt - n_blocks * tokens * input_bytes
    keep = int(max(room, 0) // kept_extra)
    return n_blocks - min(keep, n_blocks)


# micro_batch_tokens=auto's range (CPU: the min). The top is what the trainer measured, not the
# learner alone: colocated 0.5B GRPO steps on an H100 (bench/train_step.py --shape 0.5b, 168k
# tokens a step, the trainer process on one CPU thread) gave learner MFU 29.7-29.8 % at 32k-token
# micro-batches, 32.5 % at 48k and 29.8 % at 64k (where 6 blocks were also recomputed and the
# allocator retried once per update), though the learner alone is fastest at 64k.
MIN_MICRO_BATCH, MAX_MICRO_BATCH = 4096, 49152
KEEP_SHARE = 0.75  # auto micro-batches: this share of the blocks kept, the rest recomputed


def head_chunk_bytes(vocab: int) -> int:
    """The vocabulary head's fp32 logit chunks in flight at once (about 3 of 2048 tokens)."""
    return 3 * 2048 * vocab * 4


def auto_micro_batch_tokens(
    total_bytes: float,
    state_bytes: float,
    head_bytes: float,
    per_token_bytes: int,
    lo: int = MIN_MICRO_BATCH,
    hi: int = MAX_MICRO_BATCH,
) -> int:
    """`learner.micro_batch_tokens=auto`: the most tokens (a multiple of 1024 in [lo, hi]) whose
    activations, `per_token_bytes` over all blocks with `KEEP_SHARE` of them kept (the rest
    recomputed in backward), fit a GPU of `total_bytes` beside this rank's learner state
    (`state_bytes`: weights, gradients, Adam moments), the head's logit chunks and the engine's
    reserve, with 10 % to spare. A bigger micro-batch with a few blocks recomputed updates faster
    than a smaller one with none (H100, 1.5B: learner MFU 35.7 % at auto's micro-batches with 7
    of 28 blocks recomputed, 32.6 % at 14,336 tokens with none); how many blocks each step
    recomputes is `blocks_to_checkpoint`'s, from the memory free then. The update is host-bound
    at small micro-batches (a fixed cost per kernel launch, per block, per micro-batch): on an
    H100, a 0.5B update over the same 168k tokens took 2.39 s in 16k-token micro-batches and
    1.15 s in 64k ones (bench/learner_microbatch.py, the learner alone); in the trainer the gain
    stops at 48k (the figures at MAX_MICRO_BATCH). A colocated engine has released its memory by the update;
    should less be free than this assumes, activation checkpointing (auto) recomputes blocks."""
    budget = 0.9 * (total_bytes - state_bytes - head_bytes) - RESERVE_BYTES
    tokens = int(max(budget, 0) // max(KEEP_SHARE * per_token_bytes, 1)) // 1024 * 1024
    return max(lo, min(hi, tokens))
