"""Tool-call parsers, by name. The key is exactly the config value (`rollout.parser`).

A parser turns the decoded text of one assistant turn into a `ParseResult`: the prose, the valid
tool calls, and typed errors for everything malformed. It never raises: any string is a valid input.

    from agentrl.parsers import get_parser
    res = get_parser("hermes").parse('<tool_call>\\n{"name": "python", "arguments": {"code": "1"}}\\n</tool_call>')
    res.tool_calls[0].name        # 'python'

`check_template(parser, tokenizer)` is the start-up check that the model's chat template renders tool
calls in a form the configured parser reads back; a mismatch is a configuration error, not a run of
silent one-turn episodes.

One module per format (hermes.py, qwen3_coder.py, llama3.py, glm45.py, harmony.py, deepseek.py,
kimi_k2.py), registered on import here
(`rollout.parser=auto` tries them in name order); a new format is a module with a `@register(name)` class
(or a class anywhere, named by import path).
"""

from agentrl.parsers.base import (
    PARSERS,
    ParseError,
    ParseErrorKind,
    Parser,
    ParseResult,
    check_template,
    get_parser,
    register,
    resolve_parser,
    template_max_calls,
)
from agentrl.parsers.deepseek import DeepSeekParser
from agentrl.parsers.glm45 import Glm45Parser
from agentrl.parsers.harmony import HarmonyParser
from agentrl.parsers.hermes import HermesParser
from agentrl.parsers.kimi_k2 import KimiK2Parser
from agentrl.parsers.llama3 import Llama3JsonParser
from agentrl.parsers.qwen3_coder import Qwen3CoderParser

__all__ = [
    "PARSERS", "DeepSeekParser", "Glm45Parser", "HarmonyParser", "HermesParser", "KimiK2Parser", "Llama3JsonParser", "ParseError", "ParseErrorKind", "ParseResult",
    "Parser", "Qwen3CoderParser", "check_template", "get_parser", "register", "resolve_parser",
    "template_max_calls",
]  # fmt: skip
