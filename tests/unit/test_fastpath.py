"""The rollout's fast paths (agentrl/fastpath.py, and the observation delta's renders in
agentrl/render.py) give the same text and ids as the reference path (transformers' own
`apply_chat_template`, `encode`, `decode`): random multi-turn conversations (tool calls with
nested arguments, results holding markup text, several tool messages in a row, reasoning, user
follow-ups) through every template family, rendered, tokenized and cut into observation deltas
both ways, the same results and the same errors."""

import functools
import random

import pytest

from agentrl.assets.families import FAMILIES, family_tokenizer
from agentrl.render import Renderer
from agentrl.types import Message, ToolCall

pytest.importorskip("trl")
TOOLS = [{"type": "function", "function": {
    "name": "python", "description": "Run Python code.",
    "parameters": {"type": "object", "properties": {"code": {"type": "string"}},
                   "required": ["code"]}}}]  # fmt: skip
BITS = ["alpha", "beta", " ", "  ", "\n", "\n\n", "42", "{", "}", '"q"', "é", "🙂", "\t", "x=1",
        "<|im_end|>", "<|im_start|>system\n", "<tool_call>", "</tool_call>", "<tool_response>",
        "</tool_response>", "<think>", "</think>", "<|eot_id|>", "<|eom_id|>", "<|end|>",
        "<|call|>", "<|return|>", "<|observation|>", "<｜tool▁outputs▁end｜>", "<|im_middle|>",
        "\u27e61", "\u27e72", "\ue000", "\u200b"]  # fmt: skip
CONVERSATIONS = 24


def text(rng: random.Random, most: int = 12) -> str:
    return "".join(rng.choice(BITS) for _ in range(rng.randint(0, most)))


def arguments(rng: random.Random) -> dict:
    kinds = [lambda: text(rng, 6), lambda: rng.randint(-5, 5), lambda: None, lambda: 1.5,
             lambda: [text(rng, 3), 2], lambda: {"k": text(rng, 3)}, lambda: True]  # fmt: skip
    return {f"a{i}": rng.choice(kinds)() for i in range(rng.randint(0, 3))}


def conversation(rng: random.Random) -> list[Message]:
    """A system message or none, a user message, then 1-3 rounds: an assistant turn (reasoning,
    0-2 tool calls) and its results (a tool message per call, sometimes one more) or a user."""
    msgs = [Message(role="system", content=text(rng))] if rng.random() < 0.4 else []
    msgs.append(Message(role="user", content=text(rng) or "hi"))
    for turn in range(rng.randint(1, 3)):
        calls = [ToolCall(id=f"call_{turn}_{i}", name=rng.choice(["python", "search"]),
                          arguments=arguments(rng)) for i in range(rng.choice([0, 1, 1, 2]))]  # fmt: skip
        reasoning = text(rng) if rng.random() < 0.5 else None
        msgs.append(Message(role="assistant", content=text(rng), tool_calls=calls,
                            reasoning_content=reasoning))  # fmt: skip
        for c in calls + ([calls[-1]] if calls and rng.random() < 0.3 else []):
            msgs.append(Message(role="tool", content=text(rng), tool_call_id=c.id, name=c.name))
        if not calls or rng.random() < 0.2:
            msgs.append(Message(role="user", content=text(rng) or "more"))
    return msgs


def outcome(fn, *args, **kwargs):
    """What a call gives: its value, or its exception's type and message."""
    try:
        return fn(*args, **kwargs)
    except Exception as e:  # noqa: BLE001 - the same errors are part of the same behaviour
        return (type(e).__name__, str(e))


@functools.cache
def renderers(key: str) -> tuple[Renderer, Renderer]:
    fam, tok = FAMILIES[key], family_tokenizer(key)
    return (Renderer(tok, TOOLS, fam.template_kwargs, fast=True),
            Renderer(tok, TOOLS, fam.template_kwargs, fast=False))  # fmt: skip


def test_every_family_takes_the_fast_paths():
    for key in FAMILIES:
        fast, ref = renderers(key)
        assert fast.template.direct and fast.codec.backend is not None, key
        assert fast.codec.decoder is not None, key
        assert not ref.template.direct and ref.codec.backend is None and ref.codec.decoder is None


@pytest.mark.parametrize("key", list(FAMILIES))
def test_random_conversations_render_and_tokenize_the_same(key):
    fast, ref = renderers(key)
    rng = random.Random(key)
    for _ in range(CONVERSATIONS):
        msgs = conversation(rng)
        for k in range(1, len(msgs) + 1):
            for gen in (False, True):
                want = outcome(ref.render, msgs[:k], add_generation_prompt=gen)
                assert outcome(fast.render, msgs[:k], add_generation_prompt=gen) == want
                if isinstance(want, str):
                    ids = ref.encode(want)
                    assert fast.encode(want) == ids
                    assert fast.decode(ids) == ref.decode(ids)
            if msgs[k - 1].role != "assistant":
                assert outcome(fast.prompt_ids, msgs[:k]) == outcome(ref.prompt_ids, msgs[:k])


@pytest.mark.parametrize("key", list(FAMILIES))
def test_random_observation_deltas_are_the_same_ids(key):
    """Each assistant turn of a random conversation, sampled as the template writes it (and cut
    short: no turn-end token), then the messages that follow it: the same observation ids."""
    fast, ref = renderers(key)
    rng = random.Random(f"delta {key}")
    for _ in range(CONVERSATIONS):
        msgs = conversation(rng)
        for i, m in enumerate(msgs):
            if m.role != "assistant":
                continue
            new = []
            for after in msgs[i + 1 :]:
                if after.role == "assistant":
                    break
                new.append(after)
            written = outcome(ref.written_turn, msgs[:i], m)
            sampled = ref.encode(written) if isinstance(written, str) else ref.encode(m.content)
            for ids in (sampled, sampled[:-1]):
                for assistant in (m, None):
                    want = outcome(ref.observation_ids, new, ids, assistant)
                    assert outcome(fast.observation_ids, new, ids, assistant) == want
            assert fast.assistant_text(sampled) == ref.assistant_text(sampled)
