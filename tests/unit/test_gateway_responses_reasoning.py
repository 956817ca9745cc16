"""The Responses API (`POST /v1/responses`) answers a thinking model's turn with its reasoning
as a `reasoning` output item before the message and calls (as OpenAI and SGLang answer: the
SDK's ResponseReasoningItem, the text as `reasoning_text` content), as chat completions carry
it in `reasoning_content`; an agent that sends the item back in its next `input` (as the SDK's
docs ask) extends its sequence, never forks it. A canned engine answers on Qwen3's template."""

from __future__ import annotations

import asyncio

import openai
from openai.types.responses import (
    ResponseFunctionToolCall,
    ResponseOutputMessage,
    ResponseReasoningItem,
)

from agentrl.gateway import Gateway
from agentrl.parsers import get_parser
from agentrl.types import Completion, FinishReason

TOOLS = [{"type": "function", "name": "add", "parameters": {"type": "object"}}]
ANSWERS = [
    '<think>\nAdd them with the tool.\n</think>\n\n<tool_call>\n{"name": "add", "arguments": '
    '{"a": 1, "b": 2}}\n</tool_call>',
    "<think>\nThe tool said 3.\n</think>\n\nIt is 3.",
]


class Canned:
    """A thinking model's two turns: reasoning and a call, then reasoning and the answer."""

    def __init__(self, tok) -> None:
        self.tok, self.n = tok, 0

    async def generate(self, input_ids, params, key=None):
        text, self.n = ANSWERS[self.n % len(ANSWERS)], self.n + 1
        ids = self.tok.encode(text + "<|im_end|>", add_special_tokens=False)
        return Completion(ids, [-0.5] * len(ids), FinishReason.STOP)


async def two_turns(tok):
    gw = Gateway(Canned(tok), tok, get_parser("hermes"))
    url = await gw.start()
    ep = gw.open("t", 0, "s")
    try:
        async with openai.AsyncOpenAI(base_url=url, api_key=ep.key, max_retries=0) as client:
            items: list = [{"role": "user", "content": "What is 1 + 2?"}]
            first = await client.responses.create(model="m", input=items, tools=TOOLS)
            call = first.output[-1]
            items += [o.model_dump(exclude_none=True) for o in first.output]  # reasoning too
            items.append({"type": "function_call_output", "call_id": call.call_id, "output": "3"})
            second = await client.responses.create(model="m", input=items, tools=TOOLS)
    finally:
        await gw.aclose()
    return ep, first, second


def test_responses_carry_the_reasoning_item_and_its_echo_extends(qwen_tokenizer):
    ep, first, second = asyncio.run(two_turns(qwen_tokenizer))
    thought, call = first.output
    assert isinstance(thought, ResponseReasoningItem) and thought.id.startswith("rs_")
    assert [c.text for c in thought.content] == ["Add them with the tool."]
    assert isinstance(call, ResponseFunctionToolCall) and call.name == "add"
    thought, said = second.output
    assert isinstance(thought, ResponseReasoningItem)
    assert [c.text for c in thought.content] == ["The tool said 3."]
    assert isinstance(said, ResponseOutputMessage) and second.output_text == "It is 3."
    assert "think" not in second.output_text
    assert ep.counts.get("fork", 0) == 0 and ep.counts["extend"] == 1
    (cap,) = ep.trained()
    assert len(cap.seq.turns) == 2
