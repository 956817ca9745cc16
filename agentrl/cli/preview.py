"""`agentrl preview env=code_exec …`: start what the config asks for (rollout servers, sandbox,
no learner), roll out `preview.tasks` groups, print `preview.show` trajectories and the rollout
metrics, and write every trajectory to `runs/<run_name>/preview/<date>_<time>/trajectories.jsonl`
(`agentrl view` reads it)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import hydra
from hydra.core.hydra_config import HydraConfig

from agentrl.cli.logs import quiet_third_party
from agentrl.config import (
    CONFIG_DIR,
    Config,
    check_command_line,
    errors_for_people,
    load_config,
)
from agentrl.display import make_console, metrics_table, print_trajectories
from agentrl.metrics import rollout_metrics
from agentrl.run import open_run
from agentrl.types import Trajectory


async def preview(cfg: Config, out: Path) -> list[Trajectory]:
    """Run `cfg.preview.tasks` groups with the same assembly as training (no learner parts)."""
    async with open_run(cfg, out, train=False) as run:
        groups = await run.rollout.run(run.sampler.tasks[: cfg.preview.tasks])
    return [t for g in groups for t in g]


def main() -> None:
    @hydra.main(config_path=str(CONFIG_DIR), config_name="config", version_base="1.3")
    def _run(raw: Any) -> None:
        quiet_third_party()
        out = (
            Path(HydraConfig.get().runtime.output_dir)
            / "preview"
            / time.strftime("%Y-%m-%d_%H-%M-%S")
        )
        console = make_console()
        t0 = time.monotonic()
        with errors_for_people():
            cfg = load_config(raw)
            trajs = asyncio.run(preview(cfg, out))
        print_trajectories(trajs[: cfg.preview.show], console)
        metrics = rollout_metrics(trajs)
        metrics["timing_s/rollout"] = time.monotonic() - t0
        console.print(metrics_table(metrics, f"{len(trajs)} trajectories"))
        with (out / "trajectories.jsonl").open("w") as f:
            for t in trajs:
                f.write(t.to_json() + "\n")
        console.print(f"trajectories written to {out / 'trajectories.jsonl'}")

    check_command_line()  # agentrl's message for a mistake, before Hydra's; no `+` needed
    _run()


if __name__ == "__main__":
    main()
