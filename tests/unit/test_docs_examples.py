"""The examples in the docstrings users copy from must run as written."""

import asyncio
import inspect
import textwrap

import agentrl.env
import agentrl.tool
from agentrl.rollout import Rollout, RolloutConfig
from agentrl.types import Completion, FinishReason


def example(module) -> str:
    """The first indented block of the module docstring that imports something."""
    blocks, cur = [], []
    for line in inspect.getdoc(module).splitlines() + ["end"]:
        if line.startswith("    ") or (not line.strip() and cur):
            cur.append(line)
        elif cur:
            blocks.append(textwrap.dedent("\n".join(cur)))
            cur = []
    return next(b for b in blocks if "import " in b)


def test_tool_docstring_example_runs(capsys):
    exec(compile(example(agentrl.tool), "tool-example", "exec"), {"__name__": "example"})
    out = capsys.readouterr().out
    assert '"name": "add"' in out.replace("'", '"') and out.strip().endswith("5")


def test_env_docstring_example_runs_an_episode(qwen_tokenizer):
    ns: dict = {"__name__": "example"}
    exec(compile(example(agentrl.env), "env-example", "exec"), ns)
    AddEnv = ns["AddEnv"]
    tasks = AddEnv.load_tasks(n=3)
    assert tasks[2].data == {"prompt": "What is 2 + 3?", "answer": "5"}

    class Engine:  # samples a correct add call, then the number
        async def generate(self, ids, params, key=None):
            text = qwen_tokenizer.decode(ids)
            if "<tool_response>" in text:
                reply = text.split("<tool_response>\n")[-1].split("\n")[0]
            else:
                reply = '<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>'
            out = qwen_tokenizer.encode(reply, add_special_tokens=False) + [151645]
            return Completion(out, [-1.0] * len(out), FinishReason.STOP)

    ro = Rollout(Engine(), qwen_tokenizer, AddEnv, RolloutConfig())
    traj = asyncio.run(ro.run_episode(tasks[2]))
    assert traj.reward == 1.0 and len(traj.turns) == 2
