"""Episodes trained as several sequences, end to end. Both thinking policies on a thinking template with a non-hermes tool-call
format: the shipped tiny model's weights with Qwen3.5's real chat template (from `trl`: the
prompt opens <think>, calls are qwen3_coder XML), on code_exec tasks with a user's follow-up
after the first answer (a chat goes on; Qwen3.5 drops an answer's reasoning once a user message
follows it). keep trains one sequence per episode; template forks the episodes whose history the
template renders otherwise, each sequence trained on its own sampled turns."""

import asyncio
import json
import shutil
import sys
from pathlib import Path

import pytest

from agentrl.assets.build import resolve_builtin
from agentrl.assets.families import FAMILIES
from agentrl.config import compose
from agentrl.train import train

pytestmark = pytest.mark.usefixtures("shared_ray")  # one Ray for the module's runs (conftest)

ENV = '''
from agentrl.env import StepResult
from agentrl.envs.code_exec import CodeExecEnv
from agentrl.types import Message


class AskAgainEnv(CodeExecEnv):
    """code_exec, with "Sure?" from the user after the first turn that makes no tool call."""

    max_turns = 4

    async def step(self, turn):
        if turn.message.tool_calls or getattr(self, "asked", False):
            return await super().step(turn)
        self.asked = True
        return StepResult([Message(role="user", content="Sure? Give the answer again.")])
'''


@pytest.fixture(scope="module")
def thinking_model(tmp_path_factory):
    """The shipped tiny model with Qwen3.5's thinking template."""
    out = tmp_path_factory.mktemp("q35") / "tiny_qwen3_5"
    shutil.copytree(resolve_builtin("tiny"), out)
    (out / "chat_template.jinja").write_text(FAMILIES["qwen3_5_think"].template())
    return out


@pytest.mark.parametrize("thinking", ["keep", "template"])
def test_both_thinking_policies_train_a_thinking_template(thinking, thinking_model, tmp_path,
                                                           monkeypatch):  # fmt: skip
    (tmp_path / "think_env.py").write_text(ENV)
    monkeypatch.syspath_prepend(str(tmp_path))
    cfg = compose(["env=custom", "env._target_=think_env.AskAgainEnv", f"model.path={thinking_model}",
                   f"rollout.thinking={thinking}", "trainer.steps=1", "trainer.deterministic=true",
                   "trainer.tasks_per_step=2", "rollout.group_size=4", "rollout.max_new_tokens=48",
                   "logging=local", f"checkpoint.dir={tmp_path}/ckpt"])  # fmt: skip
    try:
        history = asyncio.run(train(cfg, tmp_path / "out"))
    finally:
        sys.modules.pop("think_env", None)
    assert len(history) == 1
    rows = [
        json.loads(x)
        for x in Path(tmp_path / "out" / "trajectories.jsonl").read_text().splitlines()
    ]
    print(thinking, [{k: h[k] for k in ("rollout/sequences_per_episode", "rollout/tokens",
                                        "rollout/sampled_tokens", "train/batch_tokens")}
                     for h in history])  # fmt: skip
    for h in history:
        assert h["train/skipped"] == 0 and h["rollout/sampled_tokens"] > 0
        assert h["rollout/trajectories"] == 8 * h["rollout/sequences_per_episode"]
    spe = [h["rollout/sequences_per_episode"] for h in history]
    if thinking == "keep":
        assert spe == [1.0]
    else:  # the follow-up's history renders otherwise: those episodes trained as two sequences
        assert all(s > 1.0 for s in spe)
        assert any(r.get("metadata", {}).get("sequence") == 1 for r in rows)


def test_long_episodes_train_in_segments_instead_of_overflowing(tmp_path):
    """Six turns, each answered by a 40-word tool output (about 160 tokens), in a 500-token
    context (the whole episode is about 1,000): without a policy every episode overflows after 3
    turns; with trim_tool_outputs, or a summary the model writes, they all complete, in segments,
    and the step trains on every sampled turn (the summaries too). The summarize run is
    asynchronous with partial rollouts (trainer.mode=async), the trim run synchronous."""
    long = ["env=custom", "env._target_=agentrl.envs.synthetic.FixedLengthEnv", "env.tasks.n=8",
            "env.tasks.prompt_words=20", "env.args.turns=6", "env.args.observation_words=40",
            "rollout.max_context_tokens=500",
            "rollout.max_new_tokens=16", "rollout.ignore_eos=true", "trainer.steps=1",
            "trainer.tasks_per_step=2", "rollout.group_size=2", "logging=local"]  # fmt: skip
    n = 2 * 2  # episodes a step (every length below is per episode)
    runs = {}
    for policy in ("trim_tool_outputs", "summarize"):  # none: all overflow (3 turns each,
        # 48 sampled tokens; tests/unit/test_context.py checks the overflow)
        keep = 0 if policy == "summarize" else 1  # the summary was written after the last result
        # every length here is fixed (ignore_eos, fixed observations), whatever is sampled
        # async: the second step's episodes ran across the first push (partial rollouts)
        mode = (["trainer.mode=async", "trainer.async.partial_rollouts=true", "trainer.steps=2"]
                if policy == "summarize" else ["trainer.deterministic=true"])  # fmt: skip
        cfg = compose([*long, *mode, f"rollout.context.policy={policy}",
                       "rollout.context.compact_at=0.5", f"rollout.context.keep_turns={keep}",
                       f"checkpoint.dir={tmp_path}/ckpt-{policy}"])  # fmt: skip
        runs[policy] = asyncio.run(train(cfg, tmp_path / f"out-{policy}"))[-1]
    print({p: {k: m[k] for k in ("stop/context_overflow", "stop/completed", "rollout/rewrites",
                                 "rollout/sequences_per_episode", "rollout/sampled_tokens")}
           for p, m in runs.items()})  # fmt: skip
    for policy in ("trim_tool_outputs", "summarize"):
        m = runs[policy]
        assert m["stop/context_overflow"] == 0
        assert m["stop/completed"] == n * m["rollout/sequences_per_episode"]
        assert m["rollout/rewrites"] >= 1 and m["train/skipped"] == 0
        assert m["rollout/sampled_tokens"] >= n * 6 * 16  # every turn of every episode
    # summarize: each rewrite adds the model's summary turn, sampled and trained (16 tokens)
    extra = n * 16 * runs["summarize"]["rollout/rewrites"]
    assert runs["summarize"]["rollout/sampled_tokens"] == n * 6 * 16 + extra
