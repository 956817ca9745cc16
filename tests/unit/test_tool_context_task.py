"""A tool sees its episode: `ctx.task` is the episode's task and `ctx.extra` a scratch dict of
that episode alone, shared with its env's `self.ctx` (envs/examples/kv_store.py)."""

import json

from agentrl.envs.examples.kv_store import KVEnv
from agentrl.rollout import Rollout, RolloutConfig
from agentrl.tool import ToolContext
from agentrl.types import Completion, FinishReason, StopReason


def _call(name, **args):
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": args}) + "\n</tool_call>"


class Engine:
    """Looks the asked key up (or `wrong`), then answers with the tool's reply."""

    def __init__(self, tok, wrong=None):
        self.tok, self.wrong = tok, wrong

    async def generate(self, input_ids, params, key=None):
        prompt = self.tok.decode(input_ids)
        if prompt.count("<|im_start|>assistant") == 1:
            text = _call("lookup", key=self.wrong or prompt.split("under ")[-1].split("?")[0])
        else:
            text = _call("answer", value=prompt.split("<tool_response>\n")[-1].split("\n")[0])
        ids = self.tok.encode(text, add_special_tokens=False) + [151645]
        return Completion(ids, [-0.5] * len(ids), FinishReason.STOP, weight_version="0")


async def test_a_tool_reads_its_episodes_task_and_keeps_state_for_the_reward(qwen_tokenizer):
    tasks = KVEnv.load_tasks(n=3)
    ro = Rollout(Engine(qwen_tokenizer), qwen_tokenizer, KVEnv, RolloutConfig(group_size=2))
    for group in await ro.run(tasks):
        for traj in group:
            assert traj.stop_reason is StopReason.COMPLETED, traj.error
            assert len(traj.turns) == 2 and traj.num_tool_calls == 2 and traj.reward == 1.0


async def test_an_answer_without_its_look_up_does_not_pay(qwen_tokenizer):
    task = KVEnv.load_tasks(n=1)[0]
    wrong = next(k for k in ("apple", "pear", "plum", "fig", "lime") if k != task.data["key"])
    ro = Rollout(Engine(qwen_tokenizer, wrong=wrong), qwen_tokenizer, KVEnv, RolloutConfig())
    traj = await ro.run_episode(task)
    assert traj.stop_reason is StopReason.COMPLETED and traj.reward == 0.0


def test_an_env_built_by_hand_gives_its_tools_the_task():
    task = KVEnv.load_tasks(n=1)[0]
    assert KVEnv(task).ctx.task is task
    assert ToolContext().task is None and ToolContext().extra == {}
