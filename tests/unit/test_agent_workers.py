"""Agent workers (agentrl/agent_workers.py) refuse what cannot cross to another process, and a
sandbox that cannot be shared says so when the agent uses it."""

from __future__ import annotations

import asyncio
import pickle

import pytest

from agentrl.agent_env import AgentEnv
from agentrl.agent_workers import AgentWorkers, Job, NoSandbox
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
