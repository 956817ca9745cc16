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

Resume reads a checkpoint as data, never as code: trainer_state.json and `latest` as text (the
pointer only ever names a `step_N` directory of this root), weights as safetensors, the optimizer
through agentrl/learner/checkpoint.py's allow-list reader (no pickle runs). A checkpoint holding
pickle-format weights or Python files where an engine or transformers would load them is refused.
"""

from __future__ import annotations

import base64
import contextlib
import errno
import json
import logging
import os
import random
import re
import shutil
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from agentrl.ckpt_files import damage

STATE_FILE = "trainer_state.json"
COMPLETE = "COMPLETE"
LATEST = "latest"
_STEP_DIR = re.compile(r"step_(\d+)")  # fullmatch only: no `/`, no `..`, no trailing text
_STAGED = re.compile(r"(old-)?step_\d+-[0-9a-f]{8}")  # begin()'s staging dirs, commit()'s set aside
# where an engine or transformers loads files from a checkpoint: pickle-format weights and code
# would run there (torch.load, trust_remote_code), so a resume refuses them
_LOADED_DIRS = ("model", "adapter")
_UNSAFE_SUFFIXES = (".bin", ".pt", ".pth", ".pkl", ".pickle", ".ckpt", ".py", ".pyc", ".so")

log = logging.getLogger(__name__)


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be written or resumed; the message names the path and the fix."""


class CheckpointConfig(BaseModel):
    """The `checkpoint` section: where, how often, how many, and what a run resumes from."""

    model_config = ConfigDict(extra="forbid")

    dir: str | None = Field(
        None, description="checkpoints of this run; None: runs/<run_name>/checkpoints"
    )
    every: int = Field(5, ge=0, description="save every N steps (and at the end); 0: at the end")
    keep_last: int = Field(2, ge=1, description="complete checkpoints kept (oldest removed)")
    resume: str = Field("auto", description="auto | never | a checkpoint directory")
    save_optimizer: bool = Field(
        True,
        description="AdamW's moments in each checkpoint; false: a resumed run's start from zero "
        "(the lr schedule's step is kept either way; a resume loads what a checkpoint holds)",
    )
    async_save: bool = Field(
        True,
        description="training goes on while a checkpoint's files are written (only the copy "
        "to CPU memory blocks); it becomes `latest` once written, at a later step's end",
    )
    optimizer_format: Literal["sharded", "full"] = Field(
        "sharded", description="sharded: each rank writes its shard (DCP); full: rank 0, one file"
    )

    def of_run(self, run_name: str = "default") -> CheckpointConfig:
        """These settings with `dir` filled in: runs/<run_name>/checkpoints unless set."""
        return self.model_copy(update={"dir": self.dir or f"runs/{run_name}/checkpoints"})


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
    settings: dict[str, Any] = Field(
        default_factory=dict,
        description="the run's settings, dotted keys, no secrets (agentrl.settings_diff)",
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


# -- a full disk --------------------------------------------------------------------------------
def is_disk_full(exc: BaseException) -> bool:
    """Whether `exc` (or what caused it, or a rank's failure inside torch.distributed.checkpoint's
    CheckpointException) is a write that ran out of space. torch.save on a full disk does not say
    ENOSPC: its zip writer stops short with `unexpected pos 704 vs 598`."""
    todo: list[BaseException | None] = [exc]
    seen: set[int] = set()
    while todo:
        e = todo.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        if isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        text = str(e)
        if any(m in text for m in ("unexpected pos", "No space left on device", "StorageFull",
                                   "Disk quota exceeded")):  # fmt: skip
            return True
        todo += [e.__cause__, e.__context__]
        failures = getattr(e, "failures", None)  # DCP: {rank: (exception, traceback)}
        if isinstance(failures, dict):
            todo += [f[0] for f in failures.values() if isinstance(f, tuple) and f]
    return False


def disk_full_error(path: str | Path, exc: BaseException) -> CheckpointError | None:
    """The error to raise instead of `exc` when it is a full disk (see is_disk_full), else None:
    the path, the bytes free there, and what became of the checkpoint."""
    if not is_disk_full(exc):
        return None
    path = Path(path)
    probe = path
    while not probe.exists() and probe != probe.parent:  # the staging dir may be gone already
        probe = probe.parent
    try:
        free = f"{shutil.disk_usage(probe).free:,} bytes free on that disk"
    except OSError as e:
        free = f"free space unknown ({e})"
    return CheckpointError(
        f"checkpoint not written: no space left on the device writing {path} ({free}; the "
        f"write failed with: {str(exc).strip().splitlines()[-1][:200]}). `latest` stays on the "
        "previous checkpoint; this one is discarded. Free space there, lower checkpoint.keep_last, "
        "or set checkpoint.dir to a disk with room"
    )


# -- manager ------------------------------------------------------------------------------------
class CheckpointManager:
    """Writes, finds and prunes the checkpoints of one run (one process: the driver)."""

    def __init__(self, cfg: CheckpointConfig, root: str | Path | None = None):
        self.cfg = cfg
        if root is None and cfg.dir is None:
            raise ValueError("CheckpointManager: no dir; pass cfg.of_run(run_name) or a root")
        self.root = Path(root or cfg.dir or "").expanduser().resolve()
        self.root.mkdir(parents=True, exist_ok=True)
        self.staging = self.root / ".tmp"
        # Leftovers of a killed write (never complete, never pointed to), by their names only: a
        # `.tmp` of the user's in a directory they named (checkpoint.dir=.) was removed whole
        for p in self.staging.glob("*") if self.staging.is_dir() else []:
            if _STAGED.fullmatch(p.name):
                shutil.rmtree(p, ignore_errors=True)
        with contextlib.suppress(OSError):  # gone when empty; begin() makes it again
            self.staging.rmdir()

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
        """A staging dir for a checkpoint of `step`, written over time (checkpoint.async_save):
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
        try:
            return self._commit(tmp, state)
        except OSError as e:
            full = disk_full_error(tmp, e)
            if full is None:
                raise
            raise full from e

    def _commit(self, tmp: Path, state: TrainerState) -> Path:
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
            m = _STEP_DIR.fullmatch(p.name)
            if m and self._is_complete(p):
                found.append((int(m.group(1)), p))
        return [p for _, p in sorted(found)]

    def _is_complete(self, p: Path) -> bool:
        """A complete checkpoint dir of this root itself (a symlink out of it is not one)."""
        return not p.is_symlink() and p.is_dir() and (p / COMPLETE).is_file()

    def latest(self) -> Path | None:
        """The checkpoint `latest` points to; if the pointer is missing or broken, the newest
        complete checkpoint; None if there is none. The pointer is read as a name only: one
        `step_N` directory of this root (never `../x`, an absolute path or a link out of it)."""
        pointer = self.root / LATEST
        if pointer.exists():
            name = pointer.read_text(errors="replace").strip()
            if _STEP_DIR.fullmatch(name) and self._is_complete(self.root / name):
                return self.root / name
            log.warning(
                "%s names %r, not a complete step_N checkpoint directory of %s; ignored, "
                "resuming from the newest complete checkpoint there instead",
                pointer, name[:200], self.root,
            )  # fmt: skip
        done = self.complete_checkpoints()
        return done[-1] if done else None

    def prune(self) -> None:
        """Remove complete checkpoints beyond `keep_last` (never the one `latest` names)."""
        keep = self.latest()
        done = self.complete_checkpoints()
        for p in done[: max(0, len(done) - self.cfg.keep_last)]:
            if p != keep:
                shutil.rmtree(p, ignore_errors=True)
        for p in self.staging.glob("old-step_*"):  # re-saved steps moved aside by commit
            shutil.rmtree(p, ignore_errors=True)

    def set_aside(self) -> str | None:
        """A run starting fresh in a dir holding an earlier run's checkpoints moves them (and
        `latest`) to `earlier/<time>/` there: left in place, `keep_last` pruned the new run's
        own checkpoints and kept the old higher steps, and a resume without a valid `latest`
        took the old run's newest. Returns a note for the console."""
        old = [p for p in self.root.iterdir() if _STEP_DIR.fullmatch(p.name) or p.name == LATEST]
        if not old:
            return None
        aside = self.root / "earlier" / time.strftime("%Y-%m-%d_%H-%M-%S")
        while aside.exists():
            aside = aside.with_name(aside.name + "+")
        aside.mkdir(parents=True)
        for p in old:
            os.rename(p, aside / p.name)
        _fsync_dir(self.root)
        steps = sorted(p.name for p in old if p.name != LATEST)
        return f"an earlier run's checkpoints ({', '.join(steps) or LATEST}) moved to {aside}"

    def resume_path(self) -> Path | None:
        """Where to resume from: resume=auto → latest complete (or None, a fresh start);
        never → None; a path → that checkpoint (which must be complete)."""
        r = self.cfg.resume
        if r == "never":
            return None
        if r == "auto":
            path = self.latest()
        else:
            path = Path(r).expanduser()
            if not path.is_dir():
                raise CheckpointError(
                    f"checkpoint.resume={r!r} is not a complete checkpoint: it does not exist; "
                    "give a step_N directory of a run's checkpoints, or resume=auto (the latest "
                    "complete one) or resume=never"
                )
            if not (path / COMPLETE).exists():
                inside = sorted(p for p in path.iterdir()  # a run's checkpoints dir
                                if _STEP_DIR.fullmatch(p.name) and (p / COMPLETE).is_file())  # fmt: skip
                raise CheckpointError(
                    f"resume={r!r} is not a complete checkpoint (no {COMPLETE} file); "
                    + (
                        f"it holds checkpoints: name one, e.g. checkpoint.resume={inside[-1]}"
                        if inside
                        else "use resume=auto to take the latest complete one, or resume=never"
                    )
                )
        if path is not None:
            check_loadable(path)
        return path

    def check_whole(self, path: Path) -> None:
        """A checkpoint damaged after its commit (`ckpt_files.damage`) is a CheckpointError
        naming the earlier one to resume instead (run.resume_point: before anything starts)."""
        if not (why := damage(path, load_trainer_state(path).settings)):
            return
        mine = path.resolve().parent == self.root  # step_N names sort as their steps
        earlier = [p for p in self.complete_checkpoints() if mine and p.name < path.name]
        instead = f"resume the one before it (checkpoint.resume={earlier[-1]}), " if earlier else ""
        raise CheckpointError(
            f"checkpoint {path} is damaged: {why}. It was altered or copied in part after it "
            f"was written: {instead}copy it again, or start fresh (checkpoint.resume=never)"
        )


def check_loadable(path: Path) -> None:
    """Refuse a checkpoint with files that would run code where weights are loaded from it (its
    roles' model/ and adapter/: the engine starts on model/): pickle-format weights, Python."""
    for role in sorted(p for p in path.iterdir() if p.is_dir()):
        for sub in _LOADED_DIRS:
            d = role / sub
            if not d.is_dir():
                continue
            bad = sorted(f.name for f in d.iterdir() if f.name.endswith(_UNSAFE_SUFFIXES))
            if bad:
                raise CheckpointError(
                    f"{d} holds {bad[:5]}: agentrl writes weights as safetensors only, and files "
                    "like these run code when loaded. This checkpoint was not written by agentrl "
                    "or was altered; remove them if you trust them, or resume another checkpoint"
                )


class StagedCheckpoint:
    def __init__(self, path: Path, step: int):
        self.path = path
        self.step = step
        self.state: TrainerState | None = None


def optimizer_note(path: str | Path, role: str = "policy") -> str | None:
    """What a resume from `path` says when the checkpoint holds no optimizer state for `role`
    (written with checkpoint.save_optimizer=false); None when it does."""
    optim = Path(path) / role / "optim"
    schedule = optim / "schedule.json"
    if schedule.is_file():
        try:
            fmt = json.loads(schedule.read_text()).get("format")
        except (ValueError, AttributeError):
            return None  # the load says what is wrong with it
        if fmt != "none":
            return None
        kept = "the learning-rate schedule goes on from its step"
    elif (optim / "schedule.pt").is_file():
        return None
    else:  # a checkpoint written before the schedule was kept without the optimizer
        kept = "the learning-rate schedule starts again at its first step (warm-up included)"
    return (
        f"{path} holds no optimizer state for the {role} (it was written with "
        f"checkpoint.save_optimizer=false): AdamW's moments start from zero; {kept}. "
        "Keep checkpoint.save_optimizer=true for resumes that continue exactly"
    )


def load_trainer_state(path: str | Path) -> TrainerState:
    f = Path(path) / STATE_FILE
    if not f.exists():
        raise CheckpointError(f"{path}: no {STATE_FILE}; not a checkpoint written by agentrl")
    try:
        return TrainerState.model_validate_json(f.read_bytes())
    except ValueError as e:  # pydantic's ValidationError: not JSON, or not these fields
        first = str(e).strip().splitlines()[:3]
        raise CheckpointError(
            f"{f}: not a trainer state agentrl wrote ({' '.join(first)[:300]}); the checkpoint "
            "was altered or is damaged: resume another one (checkpoint.resume=<dir>) or start fresh"
        ) from None
