"""Agent workers (agentrl/agent_workers.py) refuse what cannot cross to another process, and a
sandbox that cannot be shared says so when the agent uses it."""

from __future__ import annotations

import asyncio
import pickle

import pytest

from agentrl.agent_env import AgentEnv
from agentrl.agent_rollout import agent_notes
from agentrl.agent_workers import AgentWorkers, Job, NoSandbox
from agentrl.config import compose
from agentrl.envs.code_exec import CodeExecEnv
from agentrl.envs.examples.agent_openai import AddAgent
from agentrl.sandbox.client import ServiceSandbox
from agentrl.types import ConfigError, Task


def test_an_env_class_a_worker_cannot_import_is_a_config_error_naming_the_fix():
    class Local(AgentEnv):  # defined in a function: pickle cannot name it
        async def run(self, task, client):
            return 1.0

    job = Job(Local, Task(id="t", data={}), {}, "s", 1.0, None, "", "http://x", "k", 5.0)
    with pytest.raises(ConfigError, match="importable.*agent_workers=0"):
        asyncio.run(AgentWorkers(1).run(job))


def test_a_sandbox_that_cannot_be_shared_says_why_on_first_use():
    sb = NoSandbox("SubprocessSandbox")
    with pytest.raises(RuntimeError, match="SubprocessSandbox.*cannot be shared"):
        sb.run("print(1)")


def test_the_sandbox_service_client_crosses_to_a_worker():
    copy = pickle.loads(pickle.dumps(ServiceSandbox("http://127.0.0.1:9", token="t").worker_copy()))
    assert copy.url == "http://127.0.0.1:9" and copy._headers == {"Authorization": "Bearer t"}


def hint(cfg, classes) -> bool:
    r = cfg.rollout
    notes = agent_notes(classes, r.max_turns, r.context.policy, r.gateway.agent_workers,
                        cfg.engine.kind)  # fmt: skip
    return any("agent_workers=16" in n for n in notes)


def test_a_run_of_in_loop_agents_on_sglang_is_told_of_agent_workers():
    sglang = compose(["engine.kind=sglang"])
    assert hint(sglang, {"": AddAgent})
    assert not hint(sglang, {"": CodeExecEnv})  # no agents
    assert not hint(compose(["engine.kind=sglang", "rollout.gateway.agent_workers=4"]),
                    {"": AddAgent})  # fmt: skip
    assert not hint(compose([]), {"": AddAgent})  # the dev server: the loop is not the limit
