"""An env that returns the wrong type says so, naming the method and the fix: `start` giving the
prompt's text ends the episode `aborted` with that message (and the preview can still draw it);
`step` giving a dict, or text among its messages, is the env's error (`env_error`), not a crash
blamed on the infrastructure."""

import json

import pytest

from agentrl.display import trajectory_panel
from agentrl.env import StepResult, checked_messages
from agentrl.envs.examples.kv_store import KVEnv
from agentrl.rollout import Rollout, RolloutConfig
from agentrl.types import Completion, FinishReason, Message, StopReason


class StartText(KVEnv):
    async def start(self):
        return [self.task.data["prompt"]]


class StepDict(KVEnv):
    async def step(self, turn):
        return {"messages": [], "done": True}


class StepText(KVEnv):
    async def step(self, turn):
        return StepResult(messages=["42"])


class Engine:
    def __init__(self, tok):
        self.tok = tok

    async def generate(self, input_ids, params, key=None):
        text = "<tool_call>\n" + json.dumps({"name": "lookup", "arguments": {"key": "fig"}})
        ids = self.tok.encode(text + "\n</tool_call>", add_special_tokens=False) + [151645]
        return Completion(ids, [-0.5] * len(ids), FinishReason.STOP, weight_version="0")


async def _episode(tok, env):
    ro = Rollout(Engine(tok), tok, env, RolloutConfig())
    return await ro.run_episode(KVEnv.load_tasks(n=1)[0])


async def test_start_returning_text_names_the_fix(qwen_tokenizer):
    traj = await _episode(qwen_tokenizer, StartText)
    assert traj.stop_reason is StopReason.ABORTED and traj.messages == []
    assert "StartText.start(): got a str in its list" in traj.error
    assert "give a list of Message" in traj.error
    trajectory_panel(traj)  # the preview draws it


@pytest.mark.parametrize(
    ("env", "message"),
    [
        (StepDict, "StepDict.step() returned dict ({'messages': [], 'done': True}): return a "),
        (StepText, "StepText.step()'s StepResult.messages: got a str in its list ('42')"),
    ],
)
async def test_step_returning_the_wrong_type_is_the_envs_error(qwen_tokenizer, env, message):
    traj = await _episode(qwen_tokenizer, env)
    assert traj.stop_reason is StopReason.ENV_ERROR and message in traj.error


def test_checked_messages():
    msgs = [Message(role="user", content="hi")]
    assert checked_messages(tuple(msgs), "E.start()") == msgs
    with pytest.raises(TypeError, match=r"E.start\(\): got NoneType \(None\); give a list"):
        checked_messages(None, "E.start()")
