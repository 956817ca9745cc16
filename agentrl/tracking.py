"""Where a run's per-step numbers and trajectories go (the `logging` config group).

Sinks, each step:
    JSONL   <out>/metrics.jsonl (one line of metrics) and <out>/trajectories.jsonl (one line per
            trajectory: `Trajectory.to_dict()` + step + the trainer's per-token logprobs; the
            fields are documented on `Trajectory` and `Turn`, agentrl/types.py)
    W&B     the same metrics (x axis: step), the turn table `trajectories/turns` (one row per
            assistant turn, columns `agentrl.trajectory_view.TURN_COLUMNS`) and
            `trajectories/html` (a few whole trajectories, tokens coloured by loss mask and by
            |rollout - trainer| logprob)

Each evaluation (`trainer.eval.every`, agentrl/evaluate.py), `Tracker.log_eval`:
    JSONL   <out>/eval_trajectories.jsonl: its episodes, one line each, as trajectories.jsonl
            (`Trajectory.to_dict()` + step, no trainer logprobs) with `"eval": true`; the step is
            the one its eval/* metrics are logged at (0: the untrained policy)
    W&B     the turn table `eval/turns` and `eval/html`, as for training (same settings)

W&B never stops training and never needs the network unless asked to: `mode: auto` is online only
when WANDB_API_KEY is set (or WANDB_MODE says so), else offline, written under
`<out>/wandb/offline-run-*/` (upload later: `wandb sync <that dir>`). If wandb fails to start or to
log, the tracker warns once and goes on without it. The run id is stored in checkpoints
(`TrainerState.wandb_run_id`): a resumed run passes it back here and continues the same W&B run.
Its rows' W&B steps (`_step`) only go up, so the steps it trains again (those the killed run logged
after the checkpoint) land as new rows at their `step`, the charts' x axis, where W&B would drop them.

    tracker = Tracker(cfg.logging, out_dir, run_name="x", config=cfg.model_dump(mode="json"),
                      run_id=None, tokenizer=tokenizer)
    tracker.log_step(step, metrics, trajs, trainer_logprobs)   # every step
    tracker.log_eval(step, eval_trajs)                           # every evaluation
    tracker.close()                                              # finishes the W&B run
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import logging
import os
import struct
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field

from agentrl.trajectory_view import TURN_COLUMNS, pick, render_html, turn_rows
from agentrl.types import Trajectory

log = logging.getLogger(__name__)

Logprobs = Mapping[int, Sequence[float]]


class WandbConfig(BaseModel):
    """`logging.wandb`."""

    model_config = ConfigDict(extra="forbid")

    enabled: bool | Literal["auto"] = Field("auto", description="auto: on when wandb is installed")
    mode: Literal["auto", "online", "offline", "disabled"] = Field(
        "auto",
        description="auto: $WANDB_MODE if set, else online with $WANDB_API_KEY, else offline",
    )
    project: str = "agentrl"
    entity: str | None = None
    name: str | None = Field(None, description="run display name; default: run_name")
    group: str | None = None
    tags: list[str] = Field(default_factory=list)
    notes: str | None = None
    dir: str | None = Field(None, description="where wandb/ is written; default: the output dir")
    console: Literal["off", "auto", "wrap", "redirect"] = Field(
        "off", description="capture stdout/stderr into the W&B run"
    )
    system_metrics: bool = Field(True, description="CPU/GPU/memory sampling by wandb")
    init_timeout_s: float = Field(60.0, gt=0, description="give up starting W&B after this")
    turn_table: bool = Field(True, description="log trajectories/turns")
    table_mode: Literal["incremental", "per_step"] = Field(
        "incremental",
        description="incremental: one table growing every step (W&B server >= 0.70); "
        "per_step: a new table each step",
    )
    table_every: int = Field(1, ge=1, description="log the turn table every N steps")
    max_text_chars: int = Field(4000, ge=100, description="truncate long texts in the table")
    html_trajectories: int = Field(4, ge=0, description="trajectories in trajectories/html; 0: off")
    html_every: int = Field(1, ge=1, description="log the HTML view every N steps")
    html_max_tokens: int = Field(3000, ge=256, description="tokens shown per trajectory")


class LoggingConfig(BaseModel):
    """`logging`: local files, console and W&B."""

    model_config = ConfigDict(extra="forbid")

    jsonl: bool = Field(True, description="write <out>/metrics.jsonl every step")
    trajectories: bool = Field(True, description="write <out>/trajectories.jsonl every step")
    console_trajectories_every: int = Field(
        0, ge=0, description="print one trajectory panel every N steps; 0: never"
    )
    wandb: WandbConfig = Field(default_factory=WandbConfig)


def resolve_mode(mode: str, env: Mapping[str, str]) -> Literal["online", "offline", "disabled"]:
    """The W&B mode a run uses: explicit, or (auto) $WANDB_MODE, else online only with an API key."""
    if mode != "auto":
        return mode  # type: ignore[return-value]
    env_mode = env.get("WANDB_MODE", "").strip().lower()
    aliases = {"online": "online", "run": "online", "offline": "offline", "dryrun": "offline"}
    if env_mode in aliases:
        return aliases[env_mode]  # type: ignore[return-value]
    if env_mode == "disabled" or env.get("WANDB_DISABLED", "").lower() in ("1", "true"):
        return "disabled"
    return "online" if env.get("WANDB_API_KEY") else "offline"


@dataclass
class StepRecord:
    step: int
    metrics: Mapping[str, float]
    trajs: Sequence[Trajectory] = ()
    trainer_logprobs: Logprobs = field(default_factory=dict)
    evaluation: bool = False  # the episodes of an evaluation (metrics empty), not training's


class Sink(Protocol):
    """A destination of per-step records. `required` sinks raise; optional ones are dropped with
    one warning when they fail."""

    name: str
    required: bool

    def log(self, rec: StepRecord) -> None: ...
    def close(self, failed: bool) -> None: ...


class JsonlSink:
    name, required = "jsonl", True

    def __init__(self, out_dir: Path, metrics: bool = True, trajectories: bool = True) -> None:
        self.out, self.metrics, self.trajectories = Path(out_dir), metrics, trajectories
        self.out.mkdir(parents=True, exist_ok=True)

    FILES = ("metrics.jsonl", "trajectories.jsonl", "eval_trajectories.jsonl")

    @classmethod
    def continue_run(cls, out_dir: Path, step: int | None) -> str | None:
        """Make the run dir's files hold the steps a run continues from: resumed at `step`, drop
        lines of later steps (written after the checkpoint, they are trained again); starting
        fresh (`step` None), move the files of an earlier run to `archive/<time>/`. Nothing is
        deleted: the dropped lines go to the archive too. Returns a note for the console."""
        out = Path(out_dir)
        present = [out / n for n in cls.FILES if (out / n).exists()]
        if not present:
            return None
        stamp = time.strftime("%Y-%m-%d_%H-%M-%S")
        archive = out / "archive" / stamp
        n = 1
        while archive.exists():  # never overwrite what an earlier move kept
            archive, n = out / "archive" / f"{stamp}.{n}", n + 1
        if step is None:
            archive.mkdir(parents=True, exist_ok=True)
            for p in present:
                p.rename(archive / p.name)
            return f"an earlier run's {', '.join(p.name for p in present)} moved to {archive}"
        dropped = 0
        for p in present:
            keep = out / f".{p.name}.tmp"
            with p.open() as src, keep.open("w") as kept:
                late = None
                for line in src:
                    try:
                        row_step = json.loads(line).get("step", 0) if line.endswith("\n") else None
                    except (ValueError, AttributeError):
                        row_step = None  # a torn last line of a killed run
                    if row_step is None or row_step > step:
                        if late is None:
                            archive.mkdir(parents=True, exist_ok=True)
                            late = (archive / p.name).open("w")
                        late.write(line)
                        dropped += 1
                    else:
                        kept.write(line)
                if late is not None:
                    late.close()
            keep.replace(p)
        if dropped:
            return f"{dropped} lines of steps after {step} (trained again now) moved to {archive}"
        return None

    def log(self, rec: StepRecord) -> None:
        if rec.evaluation:
            if self.trajectories and rec.trajs:
                with (self.out / "eval_trajectories.jsonl").open("a") as f:
                    for tr in rec.trajs:
                        f.write(json.dumps({"step": rec.step, "eval": True, **tr.to_dict()}) + "\n")
            return
        if self.metrics:
            with (self.out / "metrics.jsonl").open("a") as f:
                f.write(json.dumps(dict(rec.metrics)) + "\n")
        if self.trajectories and rec.trajs:
            with (self.out / "trajectories.jsonl").open("a") as f:
                for i, tr in enumerate(rec.trajs):
                    row = {"step": rec.step, **tr.to_dict()}
                    lps = rec.trainer_logprobs.get(i)
                    if lps is not None:
                        lps = lps.tolist() if hasattr(lps, "tolist") else list(lps)
                        row["trainer_logprobs"] = [
                            x if m else 0.0 for x, m in zip(lps, tr.loss_mask, strict=True)
                        ]
                    f.write(json.dumps(row) + "\n")

    def close(self, failed: bool) -> None:
        pass


class WandbSink:
    """One W&B run (online or offline). Constructing it starts the run; errors propagate to the
    Tracker, which warns and goes on without W&B."""

    name, required = "wandb", False

    def __init__(
        self,
        cfg: WandbConfig,
        mode: str,
        out_dir: Path,
        run_name: str,
        config: Mapping[str, Any] | None,
        run_id: str | None,
        tokenizer: Any = None,
    ) -> None:
        import wandb

        self.cfg, self.tokenizer, self.wandb = cfg, tokenizer, wandb
        root = Path(cfg.dir or out_dir)
        root.mkdir(parents=True, exist_ok=True)
        settings = wandb.Settings(
            console=cfg.console,
            silent=True,
            init_timeout=cfg.init_timeout_s,
            x_disable_stats=not cfg.system_metrics,
            reinit="create_new",
        )
        self.run = wandb.init(
            project=cfg.project,
            entity=cfg.entity,
            name=cfg.name or run_name,
            group=cfg.group,
            tags=cfg.tags or None,
            notes=cfg.notes,
            dir=str(root),
            config=dict(config or {}),
            id=run_id,
            resume="allow" if run_id else None,
            mode=mode,
            settings=settings,
        )
        self.id: str = self.run.id
        self.mode = mode
        self.run_dir = Path(self.run.settings.sync_dir)
        self.tables: dict[str, Any] = {}  # incremental turn tables: training's, evaluation's
        # W&B drops a row whose step is below one it holds, and a resumed run logs again the
        # steps its killed run logged after the checkpoint: rows take W&B steps that only go up,
        # across resumes (online: where the server's history ends; offline: where this run id's
        # earlier segments here end), and charts plot against the trainer's `step` (define_metric)
        self.run.define_metric("step")
        self.run.define_metric("*", step_metric="step")
        earlier = last_logged_row(root, self.id, self.run_dir) if mode == "offline" else -1
        start = max(self.run.starting_step, earlier + 1)
        self.row, self.row_step = start - 1, -1  # the last W&B step logged, and its `step`

    def log(self, rec: StepRecord) -> None:
        cfg, wandb = self.cfg, self.wandb
        payload: dict[str, Any] = dict(rec.metrics)
        # an evaluation's episodes: every one of them (its steps are already trainer.eval.every's)
        prefix, every = ("eval", 1) if rec.evaluation else ("trajectories", None)
        if cfg.turn_table and rec.trajs and rec.step % (every or cfg.table_every) == 0:
            rows = turn_rows(rec.step, rec.trajs, rec.trainer_logprobs, cfg.max_text_chars)
            key = f"{prefix}/turns"
            if cfg.table_mode == "incremental":
                if key not in self.tables:
                    self.tables[key] = wandb.Table(columns=TURN_COLUMNS, log_mode="INCREMENTAL")
                for row in rows:
                    self.tables[key].add_data(*row)
                payload[key] = self.tables[key]
            else:
                payload[key] = wandb.Table(columns=TURN_COLUMNS, data=rows)
        if (
            cfg.html_trajectories
            and rec.trajs
            and self.tokenizer is not None
            and rec.step % (every or cfg.html_every) == 0
        ):
            chosen = pick(rec.trajs, rec.trainer_logprobs, cfg.html_trajectories)
            items = [(rec.step, rec.trajs[i], rec.trainer_logprobs.get(i)) for i in chosen]
            what = "eval after step" if rec.evaluation else "step"
            page = render_html(items, self.tokenizer, cfg.html_max_tokens, f"{what} {rec.step}",
                               what)  # fmt: skip
            payload[f"{prefix}/html"] = wandb.Html(page, inject=False, data_is_not_path=True)
        if rec.step != self.row_step:  # an evaluation shares the row of its step's metrics
            self.row, self.row_step = max(rec.step, self.row + 1), rec.step
        self.run.log({**payload, "step": rec.step}, step=self.row)

    def close(self, failed: bool) -> None:
        self.run.finish(exit_code=1 if failed else 0)


class Tracker:
    """Fans each step out to the sinks the config asks for (see the module docstring)."""

    def __init__(
        self,
        cfg: LoggingConfig,
        out_dir: str | Path,
        *,
        run_name: str = "default",
        config: Mapping[str, Any] | None = None,
        run_id: str | None = None,
        tokenizer: Any = None,
        console: Any = None,
    ) -> None:
        self.cfg, self.out, self.console = cfg, Path(out_dir), console
        self.run_id = run_id  # kept (and saved in checkpoints) even when W&B is off this time
        self.sinks: list[Sink] = [JsonlSink(self.out, cfg.jsonl, cfg.trajectories)]
        self.wandb: WandbSink | None = None
        if self._wandb_wanted():
            try:
                mode = resolve_mode(cfg.wandb.mode, os.environ)
                if mode != "disabled":
                    self.wandb = WandbSink(
                        cfg.wandb, mode, self.out, run_name, config, run_id, tokenizer
                    )
                    self.sinks.append(self.wandb)
                    self.run_id = self.wandb.id
                    self._say(self._where(resumed=run_id is not None))
            except Exception as e:  # W&B is never worth stopping a run for
                self._warn(
                    f"W&B did not start ({type(e).__name__}: {e}); training goes on, metrics in "
                    f"{self.out / 'metrics.jsonl'}. Fix the cause or set logging.wandb.enabled=false"
                )

    def _wandb_wanted(self) -> bool:
        enabled = self.cfg.wandb.enabled
        if enabled is False:
            return False
        if importlib.util.find_spec("wandb") is None:
            if enabled is True:
                self._warn(
                    "logging.wandb.enabled=true but wandb is not installed: pip install wandb"
                )
            return False
        return True

    def _where(self, resumed: bool) -> str:
        w = self.wandb
        assert w is not None
        verb = "continues" if resumed else "started"
        if w.mode == "offline":
            return (
                f"W&B run {w.id} {verb} offline in {w.run_dir} "
                f"(upload: wandb sync {w.run_dir}; or set WANDB_API_KEY to log online)"
            )
        return f"W&B run {w.id} {verb} online: {getattr(w.run, 'url', '')}"

    def _say(self, msg: str, style: str = "dim") -> None:
        if self.console is not None:
            from rich.text import Text

            self.console.print(Text(msg, style=style), soft_wrap=True)
        else:
            log.info(msg)

    def _warn(self, msg: str) -> None:
        if self.console is not None:
            self._say(f"warning: {msg}", style="yellow")
        else:
            log.warning(msg)

    def log_step(
        self,
        step: int,
        metrics: Mapping[str, float],
        trajs: Sequence[Trajectory] = (),
        trainer_logprobs: Logprobs | None = None,
    ) -> None:
        self._fan_out(StepRecord(step, metrics, trajs, trainer_logprobs or {}))

    def log_eval(self, step: int, trajs: Sequence[Trajectory]) -> None:
        """An evaluation's episodes (agentrl/evaluate.py), saved after the policy of `step`
        played them: eval_trajectories.jsonl and the W&B `eval/turns` table (module docstring).
        Call it before `log_step` of the same step, which carries the eval/* metrics."""
        self._fan_out(StepRecord(step, {}, trajs, {}, evaluation=True))

    def _fan_out(self, rec: StepRecord) -> None:
        step = rec.step
        for sink in list(self.sinks):
            if sink.required:
                sink.log(rec)
                continue
            try:
                sink.log(rec)
            except Exception as e:
                self.sinks.remove(sink)
                self._warn(
                    f"{sink.name} logging failed at step {step} ({e}); it is off from now on"
                )
                with contextlib.suppress(Exception):
                    sink.close(True)

    def alert(self, title: str, text: str) -> None:
        """A W&B alert (email/Slack when online; recorded offline), beside the console warning
        the caller prints. Never raises."""
        if self.wandb is not None and self.wandb in self.sinks:
            with contextlib.suppress(Exception):
                self.wandb.run.alert(title=title, text=text[:1000])

    def close(self, failed: bool | None = None) -> None:
        """Finish every sink. failed=None: failed if an exception is being handled."""
        if failed is None:
            failed = sys.exc_info()[0] is not None
        for sink in self.sinks:
            try:
                sink.close(failed)
            except Exception as e:
                self._warn(f"closing {sink.name} failed: {e}")
        if self.wandb is not None and self.wandb in self.sinks and self.wandb.mode == "offline":
            self._say(f"W&B offline run: wandb sync {self.wandb.run_dir}")
        self.sinks = []


# -- reading an offline run back (tests, and a look without uploading) ---------------------------
_BLOCK, _HEADER = 32768, 7


def wandb_records(path: str | Path) -> Iterator[Any]:
    """The protobuf records (`wandb_internal_pb2.Record`) of a run-<id>.wandb file, in order.

    The file is W&B's 7-byte header (":W&B", magic, version) then a LevelDB-style log: 32 KiB
    blocks of chunks, each with a 7-byte header (crc32c, length, type: 1 full, 2 first, 3 middle,
    4 last). CRCs are not checked."""
    from wandb.proto import wandb_internal_pb2 as pb

    data = Path(path).read_bytes()
    if data[:4] != b":W&B":
        raise ValueError(f"{path}: not a .wandb file (header {data[:4]!r})")
    pos, buf = _HEADER, b""
    while pos + _HEADER <= len(data):
        left = _BLOCK - pos % _BLOCK
        if left < _HEADER:  # block trailer padding
            pos += left
            continue
        _, n, kind = struct.unpack("<IHB", data[pos : pos + _HEADER])
        if n == 0 and kind == 0:  # zero padding to the end of the block
            pos += left
            continue
        chunk = data[pos + _HEADER : pos + _HEADER + n]
        pos += _HEADER + n
        if kind in (1, 2):
            buf = chunk
        else:
            buf += chunk
        if kind in (1, 4):
            rec = pb.Record()
            rec.ParseFromString(buf)
            yield rec


def last_logged_row(root: Path, run_id: str, skip: Path) -> int:
    """The last W&B step that the segments of run `run_id` under `root/wandb` logged, online or
    offline (all but `skip`; a killed one's file may end torn: what reads counts), or -1."""
    # a part started in the same second as the one before it is W&B's `<dir>-1`, `-2`, ...
    last, found = -1, (root / "wandb").glob(f"*run-*-{run_id}*/run-{run_id}.wandb")
    for path in sorted(p for p in found if p.parent != skip):
        with contextlib.suppress(Exception):
            for rec in wandb_records(path):
                if rec.WhichOneof("record_type") == "history":
                    last = max(last, rec.history.step.num)
    return last


def offline_history(run_dir: str | Path) -> list[dict[str, Any]]:
    """The history rows of an offline run dir, values JSON-decoded; media (tables, HTML) are
    dicts, e.g. row["trajectories/turns"]["path"] is the table file under files/."""
    (path,) = Path(run_dir).glob("run-*.wandb")
    rows = []
    for rec in wandb_records(path):
        if rec.WhichOneof("record_type") != "history":
            continue
        row: dict[str, Any] = {}
        for item in rec.history.item:
            keys = [item.key] if item.key else list(item.nested_key)
            d = row
            for k in keys[:-1]:
                d = d.setdefault(k, {})
            d[keys[-1]] = json.loads(item.value_json)
        rows.append(row)
    return rows
