"""rollout.thinking reaches an AgentEnv's episodes: the gateway follows it as the ToolEnv loop
does (tests/unit/test_thinking.py). An agent asks, then asks again ("Sure?") as a chat goes on;
Qwen3.5's thinking template drops an answer's reasoning once a user message follows it. Under
keep the second request extends the ids as sampled (reasoning included); under template it
samples on the template's rendering of the request, in a new sequence (before, the gateway
extended the sampled ids under both: an agent run with thinking=template trained on contexts
inference never serves). A canned engine answers over the gateway's real HTTP routes."""

from __future__ import annotations

import asyncio

import openai
import pytest

from agentrl.assets.families import family_tokenizer
from agentrl.gateway import Gateway
from agentrl.gateway.sampling import GenerationDefaults
from agentrl.parsers import get_parser
from agentrl.render import Renderer
from agentrl.rollout import RolloutConfig, generation_defaults
from agentrl.types import Completion, FinishReason

CALL = ("<tool_call>\n<function=add>\n<parameter=a>\n1\n</parameter>\n<parameter=b>\n2\n"
        "</parameter>\n</function>\n</tool_call>")  # fmt: skip
TOOLS = [{"type": "function", "function": {"name": "add", "parameters": {
    "type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}}}}]  # fmt: skip


class Thinking:
    """A thinking model: reasoning, then `acts[n]`; records each prompt it was asked with."""

    def __init__(self, tok, acts: list[str]) -> None:
        self.tok, self.acts, self.prompts = tok, acts, []

    async def generate(self, input_ids, params, key=None):
        self.prompts.append(list(input_ids))
        n = len(self.prompts)
        text = f"Plan {n}: do it.\n</think>\n\n{self.acts[n - 1]}"
        ids = self.tok.encode(text, add_special_tokens=False) + [self.tok.eos_token_id]
        return Completion(ids, [-0.5] * len(ids), FinishReason.STOP, weight_version="1")


@pytest.fixture(scope="module")
def tok():
    return family_tokenizer("qwen3_5_think")  # Qwen3.5: <think> opened by the prompt


async def chat(tok, thinking: str, follow_up: dict, acts: list[str], tools=None):
    """Two requests of one episode: the question, then its answer echoed and `follow_up`."""
    engine = Thinking(tok, acts)
    gw = Gateway(engine, tok, get_parser("qwen3_coder"), defaults=GenerationDefaults(
        max_new_tokens=64, thinking=thinking))  # fmt: skip
    url = await gw.start()
    ep = gw.open("t", 0, "s")
    extra = {"tools": tools} if tools else {}
    try:
        async with openai.AsyncOpenAI(base_url=url, api_key=ep.key, max_retries=0) as client:
            messages: list[dict] = [{"role": "user", "content": "What is 1 + 2?"}]
            first = await client.chat.completions.create(model="m", messages=messages, **extra)
            said = first.choices[0].message
            messages += [said.model_dump(exclude_none=True), follow_up(said)]
            await client.chat.completions.create(model="m", messages=messages, **extra)
    finally:
        await gw.aclose()
    return ep, engine


def again(said) -> dict:
    return {"role": "user", "content": "Sure? Give the answer again."}


def test_keep_extends_the_sampled_ids_and_template_samples_on_the_templates_rendering(tok):
    keep, keep_engine = asyncio.run(chat(tok, "keep", again, ["3", "3"]))
    ep, engine = asyncio.run(chat(tok, "template", again, ["3", "3"]))
    (one,) = keep.trained()
    assert keep.counts["extend"] == 1 and len(one.seq.turns) == 2
    assert "Plan 1" in tok.decode(keep_engine.prompts[1])  # the reasoning as sampled
    # template: the second request read what an inference server renders of it
    first, second = ep.trained()
    assert ep.counts["template"] == 1 and ep.counts.get("extend", 0) == 0
    rendered = Renderer(tok, []).prompt_ids(one.seq.messages[:3])  # question, answer, "Sure?"
    assert engine.prompts[1] == rendered == second.seq.ids[: second.seq.prompt_len]
    assert "Plan 1" not in tok.decode(rendered)  # the template dropped that reasoning
    assert second.origin == "template" and sum(second.seq.mask[: second.seq.prompt_len]) == 0
    # each sequence trains its own sampled turn, the same samples as under keep
    assert [len(c.seq.turns) for c in (first, second)] == [1, 1]
    for c, turn in ((first, one.seq.turns[0]), (second, one.seq.turns[1])):
        t = c.seq.turns[0]
        assert c.seq.ids[t.start : t.end] == one.seq.ids[turn.start : turn.end]
        assert sum(c.seq.mask) == t.end - t.start


def test_a_tool_loop_the_template_keeps_extends_under_template_too(tok):
    """Within a tool loop (no user message after the call) Qwen3.5 keeps the reasoning: the
    rendering is the ids plus the delta, so template mode starts no sequence."""

    def result(said) -> dict:
        return {"role": "tool", "tool_call_id": said.tool_calls[0].id, "content": "3"}

    ep, engine = asyncio.run(chat(tok, "template", result, [CALL, "3"], TOOLS))
    assert ep.counts["extend"] == 1 and ep.counts.get("template", 0) == 0
    (cap,) = ep.trained()
    assert len(cap.seq.turns) == 2 and "Plan 1" in tok.decode(engine.prompts[1])


def test_the_rollouts_setting_reaches_its_gateway(tok):
    renderer = Renderer(tok, [])
    for mode in ("keep", "template"):
        assert generation_defaults(RolloutConfig(thinking=mode), renderer).thinking == mode
