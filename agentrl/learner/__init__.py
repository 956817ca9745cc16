"""The learner: everything that runs in a learner process (FSDP2 workers on Ray). The config
models live here, so importing this package pulls in neither ray nor torch.distributed:

    from agentrl.learner import LearnerConfig, RayConfig
    from agentrl.learner.group import LearnerGroup
    from agentrl.learner.ray_start import start_ray

    fsdp.py          model/optimizer of one rank (build, shard, clip, gather, save, offload)
    forward.py       logprobs, entropies, values of a packed micro-batch (from hidden states)
    vocab_head.py    the vocabulary head's logprobs/entropies: fused Triton or torch kernels
    worker.py        `LearnerWorker`, the Ray actor of one rank (algorithm-blind)
    group.py         `LearnerGroup`, N workers of one role
    ray_start.py     `start_ray`: a local Ray on loopback only, or a cluster's
    update_group.py  the trainer→engines process group (shared with the dev server)
    sync/            weight-sync transports, one module each (driver half + rank half)
    ipc.py           CUDA-IPC payloads for SGLang (colocated)
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

Role = Literal["policy", "reference", "critic"]


class LoraConfig(BaseModel):
    """learner.lora: train low-rank adapters only (agentrl/learner/lora.py)."""

    model_config = ConfigDict(extra="forbid")

    rank: int = Field(0, ge=0, description="LoRA rank; 0: train every parameter")
    alpha: float = Field(16.0, gt=0, description="scale alpha / rank of the adapters' update")
    dropout: float = Field(
        0.0,
        ge=0,
        lt=1,
        description="LoRA dropout; only 0: the learner runs without dropout, as the engine "
        "samples (with it, pi / pi_old and the rollout correction read dropout noise)",
    )

    @model_validator(mode="after")
    def _no_dropout(self) -> LoraConfig:
        if self.dropout:
            raise ValueError(
                f"learner.lora.dropout={self.dropout:g}: RL scores the sampled tokens with the "
                "policy the engine samples from, which has no dropout (the update's ratio and "
                "rollout correction would read dropout noise); set learner.lora.dropout=0"
            )
        return self

    target_modules: list[str] | str = Field(
        "all-linear", description="PEFT target_modules: module names, or all-linear"
    )
    sync: Literal["auto", "adapter", "merged"] = Field(
        "auto",
        description="what the engines get: adapter = the adapters only, through SGLang's LoRA "
        "routes (agentrl/learner/sync/adapter.py); merged = the merged weights by "
        "weight_sync.method; auto: adapter when every server serves LoRA",
    )


class LearnerConfig(BaseModel):
    """One role's learner (policy, reference or critic): model, optimizer, devices, sharding."""

    model_config = ConfigDict(extra="forbid")

    model_path: str = Field("", description="local HF model dir; empty: the run's model.path")
    num_workers: int = Field(1, ge=1, description="FSDP ranks (one Ray actor per device)")
    device: Literal["auto", "cpu", "cuda"] = Field("auto", description="auto: cuda if available")
    lr: float = Field(1e-6, ge=0)
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = Field(1e-8, gt=0)
    weight_decay: float = Field(0.0, ge=0)
    lr_schedule: Literal["constant", "linear", "cosine"] = "constant"
    warmup_steps: int = Field(
        0, ge=0, description="linear warm-up from 0 over this many optimizer steps (each trainer "
        "step takes algo.ppo_epochs x algo.mini_batches of them)",
    )  # fmt: skip
    total_steps: int | None = Field(
        None, ge=1, description="decay horizon for linear/cosine, in optimizer steps"
    )
    min_lr_ratio: float = Field(0.0, ge=0, le=1, description="floor of linear/cosine decay")
    grad_clip: float = Field(1.0, ge=0, description="max global grad norm; 0: no clipping")
    micro_batch_tokens: Annotated[int, Field(ge=1)] | Literal["auto"] = Field(
        "auto",
        description="token budget of one micro-batch. auto (CUDA): the most tokens whose "
        "activations fit the GPU beside the learner's state without recomputing a block "
        "(learner/memory.py: fewer, larger micro-batches keep a host-bound update busy), between "
        "4096 and 49152 (the best in the trainer at 0.5B, learner/memory.py); 4096 on CPU",
    )
    attention_layout: Literal["packed", "padded"] = Field(
        "padded",
        description="a micro-batch's sequences run as one packed row (dense mask between them) or "
        "as the rows of a right-padded batch under a causal mask (agentrl.batch)",
    )
    mixed_precision: Literal["auto", "bf16", "fp32"] = Field(
        "auto", description="auto: bf16 compute + fp32 master weights on GPU, fp32 on CPU"
    )
    activation_checkpointing: Literal["auto", "on", "off"] = Field(
        "auto",
        description="recompute transformer blocks in backward instead of keeping their "
        "activations. on: every block; auto (CUDA): at each step, the fewest blocks that let the "
        "largest micro-batch fit the free GPU memory (train/checkpointed_blocks); off on CPU",
    )
    update_memory: Literal["segments", "expandable"] = Field(
        "segments",
        description="CUDA: `expandable` runs the update in PyTorch's expandable segments (no "
        "allocator retries from fragmentation at the edge of memory, but a colocated learner "
        "then hands its memory back page by page: +0.18 s a step at 1.5B on an H200, more than "
        "the retries it saves cost there); `segments`: the allocator as PYTORCH_CUDA_ALLOC_CONF "
        "says",
    )
    fused_kernels: Literal["auto", "liger", "off"] = Field(
        "auto",
        description="liger: liger-kernel's fused RMSNorm, RoPE and SwiGLU in the learner's model "
        "(CUDA; pip install 'agentrl[gpu]'); auto: liger when on CUDA and installed",
    )
    head_kernel: Literal["auto", "triton", "torch"] = Field(
        "auto",
        description="the vocabulary head's softmax arithmetic (learner/vocab_head.py): triton "
        "(one streaming pass per chunk forward, one fused gradient pass backward; CUDA) or torch "
        "(the same math in torch ops); auto: triton on CUDA when importable",
    )
    attention_backend: Literal["auto", "flash", "efficient", "cudnn", "math"] = Field(
        "auto",
        description="torch SDPA's kernel in the learner (CUDA). auto: any but cuDNN's (flash for "
        "the padded layout), as cuDNN builds an execution plan for every new shape, 50-120 ms "
        "forward and again backward, and a step's micro-batches each have their own; a named "
        "one: only that kernel (flash needs attention_layout=padded)",
    )
    compile: Literal["auto", "on", "off"] = Field(
        "off",
        description="torch.compile each transformer block's forward and the torch head kernel (fewer, "
        "fused kernels; the first steps pay the compile, per new shape); auto: on CUDA",
    )
    offload: Literal["auto", "all", "optimizer", "none"] = Field(
        "auto",
        description="colocated mode: what moves to CPU while the engine samples. all: parameters "
        "and optimizer state (the most room for the engine); optimizer: only the Adam moments "
        "(2/3 of the state); none: nothing moves (fastest, when both fit on the GPU); auto: the "
        "least that fits beside the engine's memory fraction (agentrl/learner/memory.py)",
    )
    reshard_after_forward: bool = True
    routing_replay: bool = Field(
        False,
        description="mixture-of-experts models: the engine returns the experts it routed each "
        "position to (SGLang's --enable-return-routed-experts) and the learner's forward uses "
        "those routes, its router's own probabilities weighting them (R3, rollout routing "
        "replay): the policy ratio then compares the same experts the engine sampled with",
    )
    lora: LoraConfig = Field(default_factory=LoraConfig)
    seed: int = 0
    deterministic: bool = Field(
        False,
        description="torch.use_deterministic_algorithms in the workers (warn_only: an op with no "
        "deterministic kernel warns), cuBLAS's fixed workspace and cuDNN without autotuning on "
        "CUDA; set by trainer.deterministic",
    )
    profile_step: int = Field(
        0, ge=0, description="profile the update of this step (torch.profiler; 0: never)"
    )
    profile_memory: bool = Field(
        False,
        description="with profile_step, on CUDA: also record the caching allocator's history "
        "over that update (every allocation, free and cache flush with its stack) into "
        "profile_dir/memory_rank<r>.pickle, for https://pytorch.org/memory_viz",
    )
    profile_dir: str = Field(
        "profile",
        description="where the profile goes: update_rank<r>.txt (the top ops) and "
        "update_rank<r>.json.gz (a Chrome/Perfetto trace)",
    )
    threads_per_worker: int = Field(1, ge=1, description="torch CPU threads of each worker")
    num_cpus_per_worker: float = Field(0.0, ge=0, description="Ray CPU resource per worker")
    num_gpus_per_worker: float = Field(1.0, ge=0, description="Ray GPU resource per worker (cuda)")
    dist_timeout_s: float = Field(600.0, gt=0, description="collective timeout")
    placement: Literal["pack", "spread", "strict_pack", "strict_spread"] = Field(
        "pack",
        description="how Ray places the ranks: one placement-group bundle per rank "
        "({CPU: num_cpus_per_worker, GPU: num_gpus_per_worker}); pack: as few nodes as possible "
        "(one node, as before); spread: across nodes, best effort; strict_*: or fail to start. "
        "Ranks on several nodes rendezvous over TCP on rank 0's node address",
    )
    placement_timeout_s: float = Field(
        120.0, gt=0, description="wait this long for Ray to place the ranks, then fail"
    )

    def resolved_device(self) -> str:
        if self.device == "auto":
            import torch

            return "cuda" if torch.cuda.is_available() else "cpu"
        return self.device

    def use_bf16(self, device: str) -> bool:
        return self.mixed_precision == "bf16" or (
            self.mixed_precision == "auto" and device == "cuda"
        )

    @model_validator(mode="after")
    def _triton_head_on_cuda(self) -> LearnerConfig:
        if self.head_kernel == "triton" and self.device == "cpu":
            raise ValueError(
                "learner.head_kernel=triton runs on CUDA only, and learner.device=cpu; "
                "use head_kernel=auto or torch"
            )
        return self

    @model_validator(mode="after")
    def _compile_or_liger(self) -> LearnerConfig:
        if self.compile != "off" and self.fused_kernels == "liger":
            raise ValueError(
                f"learner.compile={self.compile} and learner.fused_kernels=liger exclude each "
                "other (torch.compile fuses the same ops and cannot trace liger's kernels); "
                "keep one"
            )
        return self

    @model_validator(mode="after")
    def _flash_needs_padded(self) -> LearnerConfig:
        if self.attention_backend == "flash" and self.attention_layout == "packed":
            raise ValueError(
                "learner.attention_backend=flash takes no attention mask, and "
                "attention_layout=packed masks between its sequences; use attention_layout="
                "padded, or attention_backend=auto or efficient"
            )
        return self

    def sdpa_backends(self) -> dict[str, bool]:
        """torch.backends.cuda's SDPA switches for learner.attention_backend."""
        names = ("flash", "mem_efficient", "cudnn", "math")
        if self.attention_backend == "auto":
            return {n: n != "cudnn" for n in names}
        chosen = {"efficient": "mem_efficient"}.get(self.attention_backend, self.attention_backend)
        return {n: n == chosen for n in names}

    def use_compile(self, device: str) -> bool:
        return self.compile == "on" or (self.compile == "auto" and device == "cuda")

    def head_kernel_for(self, device: str) -> str:
        """learner.head_kernel resolved for a device; triton off CUDA is an error."""
        from agentrl.learner.vocab_head import triton_available  # local: configs import no torch

        if self.head_kernel == "torch" or (self.head_kernel == "auto" and device != "cuda"):
            return "torch"
        if device != "cuda":
            raise ValueError("learner.head_kernel=triton needs CUDA; use auto or torch")
        if not triton_available():
            if self.head_kernel == "triton":
                raise ValueError(
                    "learner.head_kernel=triton needs triton (it ships with CUDA torch)"
                )
            return "torch"
        return "triton"

    def use_checkpointing(self, device: str) -> bool:
        return self.activation_checkpointing == "on" or (
            self.activation_checkpointing == "auto" and device == "cuda"
        )


class RayConfig(BaseModel):
    """How the driver starts (or joins) Ray."""

    model_config = ConfigDict(extra="forbid")

    address: str | None = Field(None, description="join this running cluster; None: start one")
    num_cpus: int | None = Field(None, ge=1, description="None: all cores")
    num_gpus: int | None = Field(None, ge=0, description="None: all visible GPUs")
    object_store_mb: int = Field(256, ge=80, description="plasma store size")
    temp_dir: str | None = Field(None, description="Ray's session dir root (default /tmp/ray)")


class LearnerError(RuntimeError):
    """The learner cannot start or run; the message says what to do."""
