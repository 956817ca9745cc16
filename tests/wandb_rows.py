"""An offline W&B run's history rows, waited for (tests/unit and tests/e2e): W&B's service process
may still be flushing the .wandb file for a moment after `finish()` returned on a loaded machine."""

from __future__ import annotations

import time
from typing import Any

from agentrl.tracking import offline_history


def offline_rows(run_dir: Any, rows: int = 1, wait_s: float = 30.0) -> list[dict]:
    """The run's history once it holds `rows` rows, or what it holds after `wait_s`."""
    deadline = time.monotonic() + wait_s
    while True:
        got = offline_history(run_dir)
        if len(got) >= rows or time.monotonic() > deadline:
            return got
        time.sleep(0.2)
