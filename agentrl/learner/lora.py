"""LoRA (`learner.lora.rank > 0`): the policy trains low-rank adapters only (PEFT).

    learner.lora.rank=8 learner.lora.alpha=16 learner.lr=1e-2

The base weights are frozen; each adapted linear (default: every linear of the blocks, PEFT's
"all-linear") gets `W + (alpha / rank) B A` with A, B trained and sharded by FSDP2 like the rest.
The engines get either the adapters alone (`learner.lora.sync=adapter`, through SGLang's LoRA
routes: agentrl/learner/sync/adapter.py writes them with `save_adapter_files`) or a plain model in
the base model's names (`merged`): `param_specs` lists the base parameters (no adapter tensors),
and gathering one adapted weight returns it merged (`merged`), so every weight-sync transport and
the checkpoint's `model/` dir serve SGLang a normal checkpoint. A checkpoint also holds `adapter/`
(PEFT's layout: `PeftModel.from_pretrained(base, dir)` loads it), which resume reads, since merged
weights cannot be split again.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from torch import nn

from agentrl.learner import LoraConfig

ADAPTER = "default"  # PEFT's adapter name
_PREFIX = "base_model.model."  # what PeftModel puts before the wrapped model's names


def add_lora(model: nn.Module, cfg: LoraConfig) -> nn.Module:
    """The model wrapped by PEFT with trainable adapters; the base is frozen."""
    from peft import LoraConfig as PeftLoraConfig
    from peft import get_peft_model

    pcfg = PeftLoraConfig(r=cfg.rank, lora_alpha=cfg.alpha, lora_dropout=cfg.dropout,
                          target_modules=cfg.target_modules, bias="none")  # fmt: skip
    return get_peft_model(model, pcfg)


def is_lora(model: nn.Module) -> bool:
    return hasattr(model, "peft_config")


def engine_name(name: str) -> str:
    """`base_model.model.x.q_proj.base_layer.weight` -> `x.q_proj.weight`."""
    return name.removeprefix(_PREFIX).replace(".base_layer.", ".")


def sources(model: nn.Module) -> dict[str, tuple[str, str | None, str | None, float]]:
    """Engine name -> (base parameter, lora_A weight, lora_B weight, scale) in the model's own
    names; A and B are None for parameters without an adapter."""
    adapted: dict[str, tuple[str, str, float]] = {}
    for mname, m in model.named_modules():
        if hasattr(m, "base_layer") and hasattr(m, "lora_A") and ADAPTER in m.lora_A:
            a, b = f"{mname}.lora_A.{ADAPTER}.weight", f"{mname}.lora_B.{ADAPTER}.weight"
            adapted[f"{mname}.base_layer.weight"] = (a, b, float(m.scaling[ADAPTER]))
    out = {}
    for name, _ in model.named_parameters():
        if ".lora_" in name:
            continue
        a, b, scale = adapted.get(name, (None, None, 0.0))
        out[engine_name(name)] = (name, a, b, scale)
    return out


def merged(base: torch.Tensor, a: torch.Tensor, b: torch.Tensor, scale: float) -> torch.Tensor:
    """W + scale B A, in fp32."""
    return base.float() + scale * (b.float() @ a.float())


def adapter_params(model: nn.Module) -> list[tuple[str, torch.Tensor]]:
    return [(n, p) for n, p in model.named_parameters() if ".lora_" in n]


def save_adapter_files(tensors: dict[str, torch.Tensor], model: nn.Module, out: str | Path) -> None:
    """Rank 0: PEFT's adapter dir (adapter_config.json + adapter_model.safetensors, keys without
    the adapter name, as `PeftModel.save_pretrained` writes them)."""
    from safetensors.torch import save_file

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    save_file({k.replace(f".{ADAPTER}.", "."): v.contiguous() for k, v in tensors.items()},
              str(out / "adapter_model.safetensors"))  # fmt: skip
    model.peft_config[ADAPTER].save_pretrained(str(out))
    meta = json.loads((out / "adapter_config.json").read_text())
    if meta.get("peft_type") != "LORA":
        raise RuntimeError(f"{out}: unexpected adapter config {meta}")


def load_adapter_file(path: str | Path) -> dict[str, torch.Tensor]:
    """The adapter tensors in the model's own names (the adapter name put back)."""
    from safetensors.torch import load_file

    raw = load_file(str(Path(path) / "adapter_model.safetensors"))
    return {k.replace(".lora_A.", f".lora_A.{ADAPTER}.").replace(
        ".lora_B.", f".lora_B.{ADAPTER}."): v for k, v in raw.items()}  # fmt: skip
