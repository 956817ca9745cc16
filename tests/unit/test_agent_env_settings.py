"""Rollout settings an AgentEnv's episodes never read (its agent runs its own loop over its own
history; the gateway records it): rollout.max_turns and rollout.context.policy are refused at
start when every env of the run is an AgentEnv, and said to apply to the ToolEnvs only in a
mixture. Before, both were taken and silently not applied (AddAgent made up to its own 4
requests under rollout.max_turns=1)."""

import asyncio

import pytest

from agentrl.agent_rollout import agent_notes
from agentrl.config import compose
from agentrl.envs.code_exec import CodeExecEnv
from agentrl.envs.examples.agent_openai import AddAgent
from agentrl.run import open_run
from agentrl.types import ConfigError

AGENT = ["env=custom", "env._target_=agentrl.envs.examples.agent_openai.AddAgent"]


@pytest.mark.parametrize(
    ("setting", "says"),
    [
        ("rollout.max_turns=1", "rollout.max_turns=1 .*rollout.gateway.max_requests"),
        ("rollout.context.policy=summarize", "rollout.context.policy=summarize .*context_overflow"),
    ],
)
def test_an_agent_run_refuses_the_settings_its_agents_never_read(setting, says, tmp_path):
    cfg = compose([*AGENT, setting])

    async def start() -> None:
        async with open_run(cfg, tmp_path, train=False):
            pass  # never reached: refused before anything starts

    with pytest.raises(ConfigError, match=f"{says}.*every one is an AgentEnv \\(AddAgent\\)"):
        asyncio.run(start())


def test_a_mixture_is_told_which_envs_read_them_and_plain_runs_nothing():
    mixed = {"code": CodeExecEnv, "add": AddAgent}
    (note,) = agent_notes(mixed, 3, "none", 0, "dev")
    assert "rollout.max_turns=3" in note and "ToolEnvs only: not to add" in note
    assert agent_notes(mixed, None, "none", 0, "dev") == []
    assert agent_notes({"": CodeExecEnv}, 3, "summarize", 0, "sglang") == []
    # the note an in-loop agent on a GPU engine gets, as before
    (note,) = agent_notes({"": AddAgent}, None, "none", 0, "sglang")
    assert "rollout.gateway.agent_workers=16" in note
