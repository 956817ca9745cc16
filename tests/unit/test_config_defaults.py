"""Settings have one default, in the pydantic models; the YAML files under configs/ carry only
overrides. This walks every file of every group and fails on a key the schema does not know or
on a value equal to the schema's default (a copy that would silently drift)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from agentrl.config import CONFIG_DIR, compose, defaults_tree

SKIP_KEYS = {"defaults", "hydra"}


def files() -> list[Path]:
    return sorted(p for p in Path(CONFIG_DIR).rglob("*.yaml"))


def package(path: Path) -> list[str]:
    """Where a file's keys land: its group (configs/<group>/x.yaml), or the root."""
    if "@package _global_" in path.read_text() or path.parent == Path(CONFIG_DIR):
        return []
    return list(path.relative_to(CONFIG_DIR).parent.parts)


def leaves(tree: dict[str, Any], prefix: list[str]) -> list[tuple[list[str], Any]]:
    out = []
    for key, value in tree.items():
        if not prefix and key in SKIP_KEYS:
            continue
        if isinstance(value, dict) and value:
            out += leaves(value, [*prefix, key])
        else:
            out.append(([*prefix, key], value))
    return out


@pytest.mark.parametrize("path", files(), ids=lambda p: str(p.relative_to(CONFIG_DIR)))
def test_yaml_carries_only_overrides(path: Path) -> None:
    defaults = defaults_tree()
    raw = yaml.safe_load(path.read_text()) or {}
    for keys, value in leaves(raw, package(path)):
        if keys[0] == "env":  # the env group has no defaults: its target and tasks are the choice
            continue
        node: Any = defaults
        for k in keys:
            assert isinstance(node, dict) and k in node, f"{path}: {'.'.join(keys)} is no setting"
            node = node[k]
        if isinstance(value, float | int) and isinstance(node, float | int):
            same = float(value) == float(node)
        else:
            same = value == node
        assert not same, f"{path}: {'.'.join(keys)}={value!r} repeats the default; drop it"


def test_any_setting_overrides_without_plus_and_the_schema_default_applies() -> None:
    cfg = compose(["ray.num_cpus=2", "weight_sync.bucket_mb=8", "checkpoint.every=1"])
    assert cfg.ray.num_cpus == 2 and cfg.weight_sync.bucket_mb == 8 and cfg.checkpoint.every == 1
    assert cfg.sandbox.backend == "service" and cfg.trainer.steps == 60  # from the schema
    assert cfg.checkpoint.of_run(cfg.run_name).dir == "runs/code_exec/checkpoints"
