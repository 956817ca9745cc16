"""A broken env fails every episode alike: its warning is logged the 1st, 10th, 100th, … time
(a `start` that raised printed 64 identical lines at step 1, before the guard's one traceback)."""

from __future__ import annotations

import logging

from agentrl.envs.examples.kv_store import KVEnv
from agentrl.repeats import warn_episode
from agentrl.rollout import Rollout, RolloutConfig
from agentrl.types import StopReason


def test_each_distinct_warning_is_logged_at_powers_of_ten(caplog):
    log = logging.getLogger("test_repeats")
    with caplog.at_level(logging.WARNING, logger="test_repeats"):
        for i in range(120):
            warn_episode(log, f"t:{i}", "aborted: RuntimeError: test_repeats start is broken")
        warn_episode(log, "u:0", "aborted: KeyError: 'test_repeats other'")
    lines = [r.getMessage() for r in caplog.records]
    assert lines == [
        "episode t:0 aborted: RuntimeError: test_repeats start is broken",
        "episode t:9 aborted: RuntimeError: test_repeats start is broken (10 episodes so far; "
        "logged at 1, 10, 100, …)",
        "episode t:99 aborted: RuntimeError: test_repeats start is broken (100 episodes so far; "
        "logged at 1, 10, 100, …)",
        "episode u:0 aborted: KeyError: 'test_repeats other'",
    ]


class BrokenStart(KVEnv):
    async def start(self):
        raise RuntimeError("BrokenStart.start is broken")


async def test_a_group_whose_start_raises_logs_one_line(caplog, qwen_tokenizer):
    rollout = Rollout(None, qwen_tokenizer, BrokenStart, RolloutConfig())
    with caplog.at_level(logging.WARNING, logger="agentrl.rollout"):
        group = await rollout.run_group(KVEnv.load_tasks(n=1)[0], n=8)
    assert [t.stop_reason for t in group] == [StopReason.ABORTED] * 8
    said = [r.getMessage() for r in caplog.records if "BrokenStart.start" in r.getMessage()]
    assert len(said) == 1 and said[0].endswith("aborted: RuntimeError: BrokenStart.start is broken")
