"""A tool whose `Args` is not a pydantic model, or has no JSON schema, fails where it is defined
with a TypeError naming the class and the fix, not an AttributeError when the run starts."""

from dataclasses import dataclass

import pytest
from pydantic import BaseModel, ConfigDict

from agentrl.tool import Tool, ToolResult


def _define(args):
    class Calc(Tool):
        name, description = "calc", "Evaluate."
        Args = args

        async def __call__(self, a, ctx):
            return ToolResult(content="")

    return Calc


@dataclass
class DataclassArgs:
    expr: str


class Opaque:
    pass


class OpaqueArgs(BaseModel):
    model_config = ConfigDict(arbitrary_types_allowed=True)
    thing: Opaque


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ({"expr": str}, r"Calc: `Args` must be a pydantic model, not \{'expr'"),
        (DataclassArgs, r"Calc: `Args` must be a pydantic model, not <class .*DataclassArgs"),
        (OpaqueArgs, r"Calc: its Args has no JSON schema for the chat template \(Cannot generate"),
    ],
)
def test_a_tool_with_a_bad_args_model_fails_at_its_definition(args, message):
    with pytest.raises(TypeError, match=message):
        _define(args)


def test_a_good_args_model_gives_its_schema():
    class Args(BaseModel):
        expr: str

    assert _define(Args)().schema()["function"]["parameters"]["required"] == ["expr"]


def test_a_tool_without_args_is_told_how_to_write_them():
    """A tool that takes nothing (a clock) still needs an empty `Args`; the error says how."""
    with pytest.raises(TypeError, match=r"Clock must define `Args`: class Args\(BaseModel\).*pass"):

        class Clock(Tool):
            name, description = "clock", "The time."

            async def __call__(self, a, ctx):
                return ToolResult(content="12:00")

    class Empty(BaseModel):
        pass

    assert _define(Empty)().schema()["function"]["parameters"] == {
        "properties": {},
        "type": "object",
    }


def test_a_tool_without_a_name_is_shown_one():
    with pytest.raises(TypeError, match=r"Nameless must define `name`: name = \"my_tool\""):

        class Nameless(Tool):
            description = "Nothing."
            Args = BaseModel

            async def __call__(self, a, ctx):
                return ToolResult(content="")
