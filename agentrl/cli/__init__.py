"""The `agentrl` command: `agentrl train|preview|view|gateway …` (the same as `python -m agentrl.train`,
`python -m agentrl.cli.preview`, `python -m agentrl.cli.view`). train and preview take Hydra
overrides (`env=code_exec rollout.group_size=8`); view takes a run directory."""

from __future__ import annotations

import os
import sys

USAGE = """usage: agentrl COMMAND [ARGS]

  train    train a policy:                  agentrl train env=code_exec trainer.steps=50
  preview  roll out a few groups, print them: agentrl preview env=code_exec preview.tasks=4
  view     HTML view of a run's trajectories: agentrl view runs/<run_name> --step 5
  gateway  the OpenAI-compatible gateway alone, for agents run by hand: agentrl gateway

train, preview and gateway take Hydra overrides (group=option, key=value); `--help` shows the config."""


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    if not args or args[0] in ("-h", "--help", "help"):
        print(USAGE)
        return
    command, rest = args[0], args[1:]
    if command == "train":
        from agentrl.train import main as run  # local: each command imports only what it needs
    elif command == "preview":
        from agentrl.cli.preview import main as run  # local: as above
    elif command == "view":
        from agentrl.cli.view import main as run  # local: as above
    elif command == "gateway":
        from agentrl.cli.gateway import main as run  # local: as above
    else:
        raise SystemExit(f"agentrl: unknown command {command!r}\n\n{USAGE}")
    sys.argv = [f"agentrl {command}", *rest]  # Hydra reads its overrides from sys.argv
    # as `python -m` does: the user's own modules in the working directory import
    # (env._target_=my_env.AddEnv); a console script only has its own bin/ on the path
    if "" not in sys.path and os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    run()
