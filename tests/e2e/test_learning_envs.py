"""A user's own env learns on a laptop: the README's AddEnv (its code taken from the README's
Python block, as a user would save it) and the two-tool `envs/examples/units.py`, trained from the
shipped tiny model with the quick start's defaults (fewer steps): the policy's reward on a fixed
evaluation set (trainer.eval_every: 32 tasks x 4 samples, before the first step and after the
last) rises by 0.25 or more, the policy calls the tools, and the learner trains on what the
engine sampled.

Why the evaluation and not the steps' own rewards: a step's reward is over the 8 tasks it drew,
and their difficulty swings it as much as the policy does. The units env at seed 3, one run: step
rewards 0.30 0.39 0.39 0.36 0.59 0.53 0.64 0.63 0.41 0.59 (the last three 0.245 above the first
step: this test's old rule failed it), evaluation 0.211 -> 0.547 (step 5) -> 0.766 (step 10). Over
seeds 0-6 the evaluation rose by 0.55 to 0.78; in runs without it the old rule failed seeds 3, 4
and 6 (and seed 0 once in CI). At 10 steps the evaluation ended at 0.46-0.96 in the eight runs read
(two at 0.46 and 0.51, below the rule's 0.49); at 14 steps at 0.89-0.99 over four."""

import asyncio

import pytest
from learning_rule import assert_learned, eval_overrides

from agentrl.config import compose
from agentrl.train import train

pytestmark = pytest.mark.usefixtures("shared_ray")  # one Ray for the module's runs (conftest)

STEPS = {"readme_add": 20, "units": 14}


ENVS = {
    "readme_add": ["env=custom", "env._target_=my_env.AddEnv"],
    # deterministic: a CI run of the default (0.242 -> 0.477 at step 14, timing-dependent
    # sampling) missed the bar that local runs cleared (0.89-0.99); with the flag the run is the
    # same whatever the machine's load: 0.250 -> 0.898 (docs/checkpoints.md, reproducible; +25 s)
    "units": ["env=units", "trainer.deterministic=true"],
}


@pytest.mark.parametrize("name", sorted(ENVS))
def test_users_env_learns_from_the_shipped_tiny_model(name, readme_env, tmp_path):
    steps = STEPS[name]
    cfg = compose([*ENVS[name], *eval_overrides(steps), f"trainer.dir={tmp_path}/ckpt"])
    assert cfg.model.path == "builtin:tiny"
    history = asyncio.run(train(cfg, tmp_path / "out"))
    assert len(history) == steps
    print(f"{name} reward per step:", [round(h["reward/mean"], 3) for h in history])
    assert_learned(tmp_path / "out", steps, 0.25, name)
    assert all(h["rollout/tool_call_rate"] > 0 for h in history)
    assert max(h["train/logprob_diff"] for h in history) <= 0.01
    assert all(h["train/skipped"] == 0 for h in history)
