"""Checkpoints: save and resume a run, atomically.

A checkpoint is one directory, `<dir>/step_00000042/`:

    model/              the policy as a transformers dir (`AutoModelForCausalLM.from_pretrained`)
    optim/              optimizer + lr-schedule state (torch.distributed.checkpoint, or one file)
    critic/             the critic's model/ and optim/ when the run has one
    trainer_state.json  step, weight version, data-sampler cursor, RNG states, W&B run id, …
    COMPLETE            written last, before the directory gets its final name

Atomic: every piece is written into `<dir>/.tmp/step_…-<nonce>/`, fsync'ed, the COMPLETE marker is
added, the directory is renamed to its final name, and only then the `latest` pointer file is
replaced (write-temp + fsync + rename). A write killed at any point leaves `latest` on the previous
checkpoint; its leftovers under `.tmp/` are removed by the next `CheckpointManager`.

    mgr = CheckpointManager(CheckpointConfig(dir="runs/x/ckpt", keep_last=3))
    with mgr.write(step) as tmp:                 # tmp: the staging dir; raise to abandon it
        learner.save_checkpoint(tmp)             # model/ + optim/ (collective, on the workers)
        state = TrainerState(step=step, weight_version=str(step), data_cursor=sampler.state())
    # on exit: state saved + committed + `latest` updated + old ones pruned (keep_last)
    path = mgr.resume_path()                     # resume="auto": the latest complete one, or None
    state = load_trainer_state(path)
"""

from __future__ import annotations

import base64
import contextlib
import os
import random
import re
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

STATE_FILE = "trainer_state.json"
COMPLETE = "COMPLETE"
LATEST = "latest"
_STEP_DIR = re.compile(r"^step_(\d+)$")


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be written or resumed; the message names the path and the fix."""


class CheckpointConfig(BaseModel):
    """`trainer.checkpoint` (or wherever the lead composes it)."""

    model_config = ConfigDict(extra="forbid")

    dir: str = Field("checkpoints", description="root directory of this run's checkpoints")
    every: int = Field(0, ge=0, description="save every N steps; 0: only at the end")
    keep_last: int = Field(2, ge=1, description="complete checkpoints kept (oldest removed)")
    resume: str = Field("auto", description="auto | never | a checkpoint directory")
    save_optimizer: bool = True
    async_save: bool = Field(
        True,
        description="training goes on while a checkpoint's files are written (only the copy "
        "to CPU memory blocks); it becomes `latest` once written, at a later step's end",
    )
    optimizer_format: Literal["sharded", "full"] = Field(
        "sharded", description="sharded: each rank writes its shard (DCP); full: rank 0, one file"
    )


class TrainerState(BaseModel):
    """Everything besides weights and optimizer that a resumed run needs to continue exactly."""

    model_config = ConfigDict(extra="forbid")

    step: int = Field(ge=0, description="optimizer steps completed")
    weight_version: str = "0"
    data_cursor: dict[str, Any] = Field(default_factory=dict, description="data sampler state")
    rng: dict[str, Any] = Field(default_factory=dict, description="capture_rng() output")
    wandb_run_id: str | None = None
    consecutive_skips: int = 0
    identity: dict[str, Any] = Field(
        default_factory=dict, description="what the run trains: env, tasks, model, algorithm"
    )
    extra: dict[str, Any] = Field(default_factory=dict)


# -- RNG ----------------------------------------------------------------------------------------
def capture_rng() -> dict[str, Any]:
    """Python, numpy (if installed) and torch (CPU, and CUDA if present) RNG states as JSON."""
    import torch

    out: dict[str, Any] = {"python": _py_state_to_json(random.getstate())}
    out["torch"] = base64.b64encode(torch.get_rng_state().numpy().tobytes()).decode()
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        out["cuda"] = [
            base64.b64encode(s.numpy().tobytes()).decode() for s in torch.cuda.get_rng_state_all()
        ]
    try:
        import numpy as np
    except ImportError:  # pragma: no cover - numpy ships with torch wheels
        return out
    kind, keys, pos, has_gauss, gauss = np.random.get_state()
    out["numpy"] = [kind, keys.tolist(), int(pos), int(has_gauss), float(gauss)]
    return out


def restore_rng(state: dict[str, Any]) -> None:
    """Inverse of `capture_rng` (keys that are absent are left alone)."""
    import torch

    if "python" in state:
        random.setstate(_py_state_from_json(state["python"]))
    if "torch" in state:
        raw = bytearray(base64.b64decode(state["torch"]))
        torch.set_rng_state(torch.frombuffer(raw, dtype=torch.uint8).clone())
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(
            [
                torch.frombuffer(bytearray(base64.b64decode(s)), dtype=torch.uint8)
                for s in state["cuda"]
            ]
        )
    if "numpy" in state:
        import numpy as np

        kind, keys, pos, has_gauss, gauss = state["numpy"]
        np.random.set_state((kind, np.asarray(keys, dtype=np.uint32), pos, has_gauss, gauss))


def _py_state_to_json(s: tuple) -> list:
    version, internal, gauss = s
    return [version, list(internal), gauss]


def _py_state_from_json(s: list) -> tuple:
    version, internal, gauss = s
    return (version, tuple(internal), gauss)


# -- durable file system operations -------------------------------------------------------------
def fsync_tree(root: Path) -> None:
    """fsync every file and directory under root (and root itself)."""
    for dirpath, _, files in os.walk(root):
        for f in files:
            fd = os.open(os.path.join(dirpath, f), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        _fsync_dir(Path(dirpath))


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_file_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}.tmp")
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    _fsync_dir(path.parent)


def step_dir_name(step: int) -> str:
    return f"step_{step:08d}"


# -- manager ------------------------------------------------------------------------------------
class CheckpointManager:
    """Writes, finds and prunes the checkpoints of one run (one process: the driver)."""

    def __init__(self, cfg: CheckpointConfig, root: str | Path | None = None):
        self.cfg = cfg
        self.root = Path(root or cfg.dir).expanduser().resolve()
        self.root.mkdir(parents=True, exist_ok=True)
        self.staging = self.root / ".tmp"
        # Leftovers of a killed write: never complete, never pointed to.
        shutil.rmtree(self.staging, ignore_errors=True)

    def should_save(self, step: int, last_step: int) -> bool:
        return step == last_step or (self.cfg.every > 0 and step % self.cfg.every == 0)

    @contextlib.contextmanager
    def write(self, step: int) -> Iterator[StagedCheckpoint]:
        """Stage a checkpoint of `step`; committed on normal exit, discarded on an exception.

        The body writes its pieces under `pending.path` and sets `pending.state`."""
        pending = self.begin(step)
        try:
            yield pending
            self.finish(pending)
        finally:
            self.abandon(pending)

    def begin(self, step: int) -> StagedCheckpoint:
        """A staging dir for a checkpoint of `step`, written over time (trainer.async_save):
        `finish` commits it, `abandon` removes it; a kill before `finish` leaves `latest` as
        it was."""
        self.staging.mkdir(parents=True, exist_ok=True)
        tmp = self.staging / f"{step_dir_name(step)}-{uuid.uuid4().hex[:8]}"
        tmp.mkdir()
        return StagedCheckpoint(tmp, step)

    def finish(self, pending: StagedCheckpoint) -> Path:
        if pending.state is None:
            raise CheckpointError(f"checkpoint of step {pending.step}: no TrainerState was set")
        return self.commit(pending.path, pending.state)

    def abandon(self, pending: StagedCheckpoint) -> None:
        shutil.rmtree(pending.path, ignore_errors=True)

    def commit(self, tmp: Path, state: TrainerState) -> Path:
        """Make a fully written staging dir the latest checkpoint (see the module docstring)."""
        (tmp / STATE_FILE).write_text(state.model_dump_json(indent=2))
        fsync_tree(tmp)
        (tmp / COMPLETE).write_text(str(state.step))
        fsync_tree(tmp)
        final = self.root / step_dir_name(state.step)
        if final.exists():  # a re-save of this step (after a resume): move the old one aside
            trash = self.staging / f"old-{final.name}-{uuid.uuid4().hex[:8]}"
            os.rename(final, trash)
            _fsync_dir(self.root)
        os.rename(tmp, final)
        _fsync_dir(self.root)
        write_file_atomic(self.root / LATEST, final.name)
        self.prune()
        return final

    def complete_checkpoints(self) -> list[Path]:
        """Complete checkpoint dirs, oldest first."""
        found = []
        for p in self.root.iterdir():
            m = _STEP_DIR.match(p.name)
            if m and p.is_dir() and (p / COMPLETE).exists():
                found.append((int(m.group(1)), p))
        return [p for _, p in sorted(found)]

    def latest(self) -> Path | None:
        """The checkpoint `latest` points to; if the pointer is missing or broken, the newest
        complete checkpoint; None if there is none."""
        pointer = self.root / LATEST
        if pointer.exists():
            target = self.root / pointer.read_text().strip()
            if (target / COMPLETE).exists():
                return target
        done = self.complete_checkpoints()
        return done[-1] if done else None

    def prune(self) -> None:
        """Remove complete checkpoints beyond `keep_last` (never the one `latest` names)."""
        keep = self.latest()
        done = self.complete_checkpoints()
        for p in done[: max(0, len(done) - self.cfg.keep_last)]:
            if p != keep:
                shutil.rmtree(p, ignore_errors=True)
        for p in self.staging.glob("old-*"):  # re-saved steps moved aside by commit
            shutil.rmtree(p, ignore_errors=True)

    def resume_path(self) -> Path | None:
        """Where to resume from: resume=auto → latest complete (or None, a fresh start);
        never → None; a path → that checkpoint (which must be complete)."""
        r = self.cfg.resume
        if r == "never":
            return None
        if r == "auto":
            return self.latest()
        path = Path(r).expanduser()
        if not (path / COMPLETE).exists():
            raise CheckpointError(
                f"resume={r!r} is not a complete checkpoint (no {COMPLETE} file); "
                "use resume=auto to take the latest complete one, or resume=never"
            )
        return path


class StagedCheckpoint:
    def __init__(self, path: Path, step: int):
        self.path = path
        self.step = step
        self.state: TrainerState | None = None


def load_trainer_state(path: str | Path) -> TrainerState:
    f = Path(path) / STATE_FILE
    if not f.exists():
        raise CheckpointError(f"{path}: no {STATE_FILE}; not a checkpoint written by agentrl")
    return TrainerState.model_validate_json(f.read_text())
