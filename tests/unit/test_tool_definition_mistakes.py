"""A Tool's mistakes fail where the class is defined, naming the fix: a `__call__(self, args)`
without ctx raised out of the env's step (every episode `env_error`, the policy's fault), a tool
with `run` for `__call__` failed each call at run time, a name with a space is one no tool call
can write."""

from __future__ import annotations

import pytest
from pydantic import BaseModel

from agentrl.tool import Tool, ToolResult


class Args(BaseModel):
    word: str


def test_a_call_without_ctx_is_refused_where_it_is_written():
    with pytest.raises(TypeError, match=r"Guess: its __call__ cannot be called with \(args, ctx"):

        class Guess(Tool):
            name, description, Args = "guess", "Guess the word.", Args

            async def __call__(self, args):
                return ToolResult(content=args.word)


def test_a_tool_without_call_is_told_which_method_to_rename():
    with pytest.raises(TypeError, match=r"Guess must define `async def __call__\(self, args, ctx.*"
                       r"\(it has run\(\): rename it\)"):  # fmt: skip

        class Guess(Tool):
            name, description, Args = "guess", "Guess the word.", Args

            async def run(self, args, ctx):
                return ToolResult(content=args.word)


def test_a_name_no_tool_call_can_write_is_refused():
    with pytest.raises(TypeError, match=r"name 'guess word' is not one the model can write"):

        class Guess(Tool):
            name, description, Args = "guess word", "Guess the word.", Args

            async def __call__(self, args, ctx):
                return ToolResult(content=args.word)


def test_good_tools_pass_async_or_plain_with_any_parameter_names():
    class Guess(Tool):
        name, description, Args = "guess-word.v2", "Guess the word.", Args

        async def __call__(self, a, context=None):
            return ToolResult(content=a.word)

    class Plain(Tool):
        name, description, Args = "plain", "Plain def.", Args

        def __call__(self, args, ctx):
            return ToolResult(content=args.word)

    assert Guess().name == "guess-word.v2" and Plain().name == "plain"
