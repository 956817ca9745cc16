"""agentrl: multi-turn tool-use RL for LLM agents. What users write against:

    from agentrl import Env, ToolEnv, Tool, ToolResult, Task, Trajectory, StopReason

An Env (one instance per episode) hands the model a task, steps on its turns and scores the
trajectory; a Tool has a name, a description, an `Args` model and an async `__call__`. Algorithms,
parsers, sandbox backends and weight-sync methods are chosen by name in the config, and a
`module:attr` import path works anywhere a name does (agentrl/registry.py).
"""

from agentrl.env import AssistantTurn, Env, StepResult, ToolEnv
from agentrl.registry import Registry
from agentrl.tool import Tool, ToolContext, ToolResult
from agentrl.types import (
    Completion,
    ConfigError,
    FinishReason,
    Message,
    StopReason,
    Task,
    ToolCall,
    ToolOutcome,
    Trajectory,
    Turn,
)

__all__ = [
    "AssistantTurn",
    "Completion",
    "ConfigError",
    "Env",
    "FinishReason",
    "Message",
    "Registry",
    "StepResult",
    "StopReason",
    "Task",
    "Tool",
    "ToolCall",
    "ToolContext",
    "ToolEnv",
    "ToolOutcome",
    "ToolResult",
    "Trajectory",
    "Turn",
]
