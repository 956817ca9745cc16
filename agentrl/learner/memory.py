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
        frozen = 0 if mode == "all" else frozen_bytes  # weights only; `all` moves them too
        resident = sum(n * (RESIDENT_BYTES[mode] if trains else frozen) for n, trains in params)
        choice = OffloadChoice(mode, resident / ranks, engine, available_bytes)
        if choice.learner_bytes + engine + RESERVE_BYTES <= available_bytes:
            break
    return choice  # at worst all: nothing of the learner stays; the engine alone must fit


def engine_fraction(extra_args: list[str], default: float = 0.9) -> float:
    """SGLang's `--mem-fraction-static` from engine.extra_args (`--flag V` or `--flag=V`); its
    own default depends on the GPU (up to ~0.9), so a missing flag counts as 0.9."""
    for i, a in enumerate(extra_args):
        if a == "--mem-fraction-static" and i + 1 < len(extra_args):
            return float(extra_args[i + 1])
        if a.startswith("--mem-fraction-static="):
            return float(a.split("=", 1)[1])
    return default
