"""`agentrl view RUN_DIR [--eval] [--step N] [--env NAME] [-n 4] [-o view.html]`: an HTML page
of a run's trajectories, token by token (agentrl/trajectory_view.py draws it), for runs without
W&B. Reads the run's trajectories.jsonl (runs/<run_name>/; when it has not trained, the newest of
its preview/ and gateway/ session folders, a gateway's episodes newest first), or with --eval its
eval_trajectories.jsonl (the episodes of each evaluation, trainer.eval.every; --step picks the
evaluation after that step, 0 the untrained policy's); --env shows only one env's episodes of a
mixture (env=mixture: each trajectory's metadata names its env); the tokenizer comes from the
run's saved Hydra config (or --tokenizer)."""

from __future__ import annotations

import argparse
import re
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf
from transformers import AutoTokenizer

from agentrl.config import ModelConfig
from agentrl.display import safe_text
from agentrl.trajectory_view import load_jsonl, pick, render_html, steps_in


def _saved_config(folder: Path) -> Path | None:
    """The newest Hydra config saved for the run `folder` belongs to: runs/<name>/.hydra/<time>/
    (a preview's folder is runs/<name>/preview/<time>/), or an older <dir>/.hydra/config.yaml."""
    for d in (folder, *folder.parents[:2]):
        found = sorted((d / ".hydra").glob("*/config.yaml")) or sorted(
            (d / ".hydra").glob("config.yaml")
        )
        if found:
            return found[-1]
    return None


SESSIONS = ("preview", "gateway")  # runs/<name>/<kind>/<date>_<time>/: `agentrl preview|gateway`


def _find_trajectories(run: Path, name: str = "trajectories.jsonl") -> Path:
    """A trajectories.jsonl (`name`) given, in `run`, or in its newest session folder: a
    preview's or a gateway's, named by the time it started (`run` may be one kind's folder)."""
    if not run.is_dir():
        return run
    if (run / name).exists():
        return run / name
    kinds = [run] if run.name in SESSIONS else [run / kind for kind in SESSIONS]
    sessions = [p for kind in kinds for p in kind.glob(f"*/{name}")]
    return max(sessions, key=lambda p: p.parent.name) if sessions else run / name


def _from_gateway(path: Path) -> bool:
    """A gateway session's file: its episodes appended as each was closed (no steps)."""
    return path.parent.parent.name == "gateway"


def _tokenizer_for(run: Path, given: str | None) -> Any:
    if given:
        return AutoTokenizer.from_pretrained(given)
    hydra_cfg = _saved_config(run)
    if hydra_cfg is None:
        raise SystemExit(f"{run}: no saved .hydra config to find the model; pass --tokenizer DIR")
    raw = OmegaConf.to_container(OmegaConf.load(hydra_cfg), resolve=False)["model"]
    model = ModelConfig(**raw)
    return AutoTokenizer.from_pretrained(model.tokenizer or model.resolve())


def _out_name(evaluation: bool, env: str | None, step: int) -> str:
    """view_[eval_][<env>_]<step>.html: views of two envs of one step do not overwrite each
    other (`--env`); an env name that could leave the folder is made safe."""
    env_part = re.sub(r"[^A-Za-z0-9_.-]", "_", env) + "_" if env else ""
    return f"view_{'eval_' if evaluation else ''}{env_part}{step}.html"


def _skipped_lines(path: Path, skipped: list[str], show: int = 10) -> str:
    """What reading `path` skipped, for the console ("" for nothing), a line each (the first
    `show` of them), control characters written out."""
    if not skipped:
        return ""
    more = f"\n  … and {len(skipped) - show} more" if len(skipped) > show else ""
    lines = "".join(f"\n  {safe_text(x)}" for x in skipped[:show])
    return f"{path}: {len(skipped)} lines not read as they are:{lines}{more}\n"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description="Write an HTML view of a run's trajectories.")
    ap.add_argument("run", type=Path, help="a training output dir, or its trajectories.jsonl")
    ap.add_argument(
        "--eval", action="store_true", help="the evaluation episodes (eval_trajectories.jsonl)"
    )
    ap.add_argument("--step", type=int, default=None, help="which step (default: the last)")
    ap.add_argument("--env", default=None, help="env=mixture: only this env's trajectories")
    ap.add_argument(
        "-n", type=int, default=4, help="trajectories to show: best, worst, most calls, … (4)"
    )
    ap.add_argument(
        "-o", "--out", type=Path, default=None, help="default: <run>/view_[<env>_]<step>.html"
    )
    ap.add_argument("--tokenizer", default=None, help="default: the run's model (.hydra config)")
    ap.add_argument("--max-tokens", type=int, default=3000)
    a = ap.parse_args(argv)
    name = "eval_trajectories.jsonl" if a.eval else "trajectories.jsonl"
    path = _find_trajectories(a.run, name)
    if not path.exists():
        hint = " (evaluations are saved by runs with trainer.eval.every)" if a.eval else ""
        raise SystemExit(
            f"{path}: no such file (give a run's dir, runs/<run_name>, a preview's folder or a "
            f"{name}){hint}"
        )
    skipped: list[str] = []
    items = load_jsonl(path, a.step, skipped)
    said = _skipped_lines(path, skipped)
    if not items:
        steps = steps_in(path)
        last = f"its last step, {steps[-1]}" if steps else "any step"
        which = f"step {a.step}" if a.step is not None else last
        raise SystemExit(f"{said}{path}: no trajectories for {which}; "
                         + (f"it has steps {steps}" if steps else "it holds none"))  # fmt: skip
    if said:
        print(said, end="")
    if a.env is not None:
        envs = sorted({str(t.metadata.get("env")) for _, t, _ in items if "env" in t.metadata})
        items = [item for item in items if item[1].metadata.get("env") == a.env]
        if not items:
            raise SystemExit(f"{path}: no trajectories of env {a.env!r} at that step; its envs: "
                             f"{envs or 'none named (not a mixture run)'}")  # fmt: skip
    if _from_gateway(path):  # newest first: the episodes just run by hand are the ones to read
        items.reverse()
    trajs = [t for _, t, _ in items]
    lps = {i: lp for i, (_, _, lp) in enumerate(items) if lp is not None}
    chosen = [items[i] for i in pick(trajs, lps, a.n)]
    tok = _tokenizer_for(path.parent, a.tokenizer)
    evaluation = a.eval or path.name == "eval_trajectories.jsonl"
    kind = "eval after step" if evaluation else "step"
    step = items[0][0]
    out = a.out or path.parent / _out_name(evaluation, a.env, step)
    title = f"{path.parent.name} {kind} {step}" + (f" · env {a.env}" if a.env else "")
    out.write_text(render_html(chosen, tok, a.max_tokens, title, kind), encoding="utf-8")
    more = f"; -n {len(items)} draws them all" if len(chosen) < len(items) else ""
    print(f"wrote {out} ({len(chosen)} of the {len(items)} trajectories of {kind} {step}{more})")


if __name__ == "__main__":
    main()
