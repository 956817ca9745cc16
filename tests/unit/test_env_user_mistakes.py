"""A new user's mistakes in an Env, found at the door with the fix named: a wrong method
signature or a tool listed as its class (a `step(self)` made every episode `env_error`, scored 0
as the policy's fault; `tools = [Add]` a raw traceback), tasks as dicts or without the `prompt`
ToolEnv sends (every episode `aborted: KeyError: 'prompt'`)."""

from __future__ import annotations

import pytest
from pydantic import BaseModel

from agentrl.env import ToolEnv
from agentrl.env_config import EnvConfig, check_env_class
from agentrl.tool import Tool, ToolContext, ToolResult
from agentrl.types import ConfigError, Message, Task


class Add(Tool):
    name, description = "add", "Add two integers."

    class Args(BaseModel):
        a: int
        b: int

    async def __call__(self, args, ctx: ToolContext) -> ToolResult:
        return ToolResult(content=str(args.a + args.b))


class Good(ToolEnv):
    tools = [Add()]

    @classmethod
    def load_tasks(cls, n: int = 3) -> list[Task]:
        return [
            Task(id=str(i), data={"prompt": f"{i} + 1?", "answer": str(i + 1)}) for i in range(n)
        ]

    async def reward(self, trajectory) -> float:
        return 1.0


class RewardNoTrajectory(Good):
    async def reward(self):
        return 1.0


class StepNoTurn(Good):
    async def step(self):
        return None


class InitNoTask(Good):
    def __init__(self):
        super().__init__(Task(id="x"))


class TasksNotClassmethod(Good):
    def load_tasks(cls, n: int = 3):
        return []


class ToolAsClass(Good):
    tools = [Add]


@pytest.mark.parametrize(
    ("cls", "message"),
    [
        (
            RewardNoTrajectory,
            r"reward\(\) cannot be called .*`async def reward\(self, trajectory\)",
        ),
        (StepNoTurn, r"StepNoTurn.step\(\) cannot be called .*`async def step\(self, turn\)"),
        (
            InitNoTask,
            r"__init__ cannot take \(task, ctx, \*\*env.args\); write it as `def __init__",
        ),
        (TasksNotClassmethod, r"load_tasks is not a classmethod .*; put @classmethod above it"),
        (ToolAsClass, r"ToolAsClass.tools holds <class .*Add'>, not a Tool instance; list Add\(\)"),
    ],
)
def test_an_env_the_rollout_cannot_call_is_refused_at_the_door(cls, message):
    with pytest.raises(ConfigError, match=message):
        check_env_class(cls, {}, "env._target_='my_env.X'")


def test_a_good_env_passes_and_env_args_its_init_cannot_take_do_not():
    check_env_class(Good, {"max_turns": 2}, "env")

    class OwnInit(Good):
        def __init__(self, task, ctx=None):
            super().__init__(task, ctx)

    check_env_class(OwnInit, {}, "env")
    with pytest.raises(ConfigError, match=r"OwnInit.__init__ cannot take .*unexpected keyword"):
        check_env_class(OwnInit, {"max_turns": 2}, "env")


class TasksAsDicts(Good):
    @classmethod
    def load_tasks(cls, n: int = 3):
        return [{"id": str(i), "prompt": "1 + 1?"} for i in range(n)]


class NoPrompt(Good):
    @classmethod
    def load_tasks(cls, n: int = 3):
        return [Task(id=str(i), data={"question": "1 + 1?", "answer": "2"}) for i in range(n)]


class NoPromptOwnStart(NoPrompt):
    async def start(self) -> list[Message]:
        return [Message(role="user", content=self.task.data["question"])]


def test_tasks_as_dicts_or_without_the_prompt_toolenv_sends_are_named():
    cfg = EnvConfig(_target_="x.Y")
    with pytest.raises(ConfigError, match=r"item 0 is a dict \(.*\), not a Task; return Task\("):
        cfg.load_tasks(TasksAsDicts)  # was AttributeError: 'dict' object has no attribute 'id'
    with pytest.raises(ConfigError, match=r"task '0' has no 'prompt' \(its data: question, ans"):
        cfg.load_tasks(NoPrompt)  # was every episode `aborted: KeyError: 'prompt'`
    assert len(cfg.load_tasks(NoPromptOwnStart)) == 3
