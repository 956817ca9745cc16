"""What the entry points keep off the console: one INFO line per HTTP request, and W&B's
suggestion to install Weave (printed on every run: agentrl imports openai, one of the libraries
W&B looks for)."""

from __future__ import annotations

import logging
import os
import sys

# httpx: agentrl's own clients; httpx2: the openai SDK's (3.x) fork of it, which an AgentEnv's
# agent calls the gateway through (one INFO line per request: 100 a step in the docs' example)
HTTP_LOGGERS = ("httpx", "httpx2")


def quiet_third_party() -> None:
    """Keep the HTTP clients' warnings and errors, drop their line per request; turn W&B's Weave
    integration off unless the user imported weave or set WANDB_DISABLE_WEAVE themselves."""
    for name in HTTP_LOGGERS:
        logging.getLogger(name).setLevel(logging.WARNING)
    if "weave" not in sys.modules:
        os.environ.setdefault("WANDB_DISABLE_WEAVE", "true")
