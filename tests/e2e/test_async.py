"""trainer.mode=async on the whole CPU stack (dev server, sandbox, FSDP2 on Ray, gloo weight sync),
the quick start's settings (in CI smaller steps): rollouts run on while the learner trains, ahead
of it by at least one version and never by more than trainer.async.max_staleness, and every
trained token carries the version that sampled it.

Async is no algorithm family: it learned here by the rule of tests/e2e/learning_rule.py (14 steps:
evaluation +0.59, +0.74 at max_staleness 1, +0.60, +0.74 at 4, seeds 0-1), and CI keeps one
learning run per family, so this runs 3 small steps at max_staleness 2 and checks the mechanics
(staleness 0, 1, 2: the bound is reached by the third step);
`AGENTRL_LEARN_ALL=1` runs the learning version (s=1 and s=4). Also covered: the staleness
accounting by hand in tests/unit/test_producer.py, cut turns that go on under new weights in
tests/e2e/test_devserver.py, empty steps within the bound in tests/e2e/test_empty_steps.py."""

import asyncio
import json
import os

import pytest
from learning_rule import assert_learned, eval_overrides

from agentrl.config import compose
from agentrl.train import train

pytestmark = pytest.mark.usefixtures("shared_ray")  # one Ray for the module's runs (conftest)

LEARN = bool(os.environ.get("AGENTRL_LEARN_ALL"))
STEPS = 14 if LEARN else 3  # learning: +0.59, +0.74 (s=1), +0.60, +0.74 (s=4); bar +0.25


# an agent of any framework (AgentEnv through the gateway, docs/agents.md) with dynamic sampling
AGENT = ["env=custom", "env._target_=agentrl.envs.examples.agent_openai.AddAgent",
         "trainer.sampling.dynamic_sampling=true"]  # fmt: skip
CASES = {"s1": (1, []), "s4": (4, [])} if LEARN else {"s2": (2, []), "agent-s2": (2, AGENT)}
# CI: 4 groups of 4 a step instead of the quick start's 8 of 8 (the rollouts still outrun the
# learner: staleness 0, 1, 2 as before; about 4 s a case)
MECHANICS = [f"trainer.steps={STEPS}", "trainer.tasks_per_step=4", "rollout.group_size=4",
             "checkpoint.every=0", "logging=local"]  # fmt: skip


@pytest.mark.parametrize("case", sorted(CASES))
def test_quick_start_in_async_mode_stays_within_the_staleness_bound(case, tmp_path):
    staleness, env = CASES[case]
    learn = eval_overrides(STEPS) if LEARN else MECHANICS
    cfg = compose([*env, *learn, f"checkpoint.dir={tmp_path}/ckpt", "trainer.mode=async",
                   f"trainer.async.max_staleness={staleness}"])  # fmt: skip
    history = asyncio.run(train(cfg, tmp_path / "out"))
    assert [h["step"] for h in history] == [float(s) for s in range(1, STEPS + 1)]
    rewards = [round(h["reward/mean"], 3) for h in history]
    stale = [h["async/staleness_max"] for h in history]
    print(f"async {case} reward per step:", rewards, "staleness max:", stale)
    if env:  # every request after an episode's first extended its sequence
        assert all(h["gateway/extend"] > 0 and h["gateway/fork"] == 0 for h in history)
    if LEARN:
        assert_learned(tmp_path / "out", STEPS, 0.25, f"async s={staleness}")
    assert all(h["rollout/tool_call_rate"] > 0 for h in history)
    assert max(stale) <= staleness
    assert max(stale) >= 1, "the rollouts never ran ahead of the learner: nothing was async"
    # stale_policy=wait launches no group that could be too stale when taken: none dropped
    assert all(h["train/skipped"] == 0 and h["async/dropped"] == 0 for h in history)
    # turns a push cut (trainer.async.partial_rollouts; here rollouts are quick and often all done
    # before the push: tests/e2e/test_devserver.py cuts long generations on purpose)
    print("cut turns per push:", [h["sync/cut_turns"] for h in history],
          "trained turns with two versions:", [h["async/partial_turns"] for h in history])  # fmt: skip
    # every trained token's version is within the bound of the step that trained it, and the
    # versions within a turn only go forward
    for line in (tmp_path / "out" / "trajectories.jsonl").read_text().splitlines():
        row = json.loads(line)
        trained_at = int(row["step"]) - 1  # the version the update of that step started from
        for turn in row["turns"]:
            versions = [int(v) for _, v in turn["segments"]] or [int(turn["weight_version"])]
            assert versions == sorted(versions) and versions[0] == int(turn["weight_version"])
            assert 0 <= trained_at - versions[0] <= staleness, row["step"]
            assert sum(n for n, _ in turn["segments"]) in (0, turn["end"] - turn["start"])
