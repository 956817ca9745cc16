"""Token-exact rendering with the real Qwen BPE and both of our chat templates."""

import pytest

from agentrl.fastpath import content_prefix
from agentrl.render import Renderer
from agentrl.types import Message, ToolCall

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "python",
            "description": "run code",
            "parameters": {"type": "object", "properties": {"code": {"type": "string"}}},
        },
    }
]
START = [Message(role="system", content="Be brief."), Message(role="user", content="2+2?")]


def sampled_ids(r: Renderer, msg: Message) -> list[int]:
    """What a model that follows the template would sample for `msg`: its rendering + <|im_end|>."""
    text = r.delta_text([Message(role="user", content="q"), msg])
    head = text.split("<|im_start|>assistant\n")[1]  # the assistant turn as rendered
    return r.encode(head[: head.index("<|im_end|>") + len("<|im_end|>")])


def conversation(r: Renderer, turns: list[tuple[Message, list[Message]]]):
    """Build ids turn by turn as the rollout does; return ids, mask and the observation blocks."""
    ids = r.prompt_ids(START)
    mask = [0] * len(ids)
    blocks = []
    for assistant, obs in turns:
        s = sampled_ids(r, assistant)
        prefix = list(ids)
        ids += s
        mask += [1] * len(s)
        if obs:
            o = r.observation_ids(obs, s)
            blocks.append((len(ids), o))
            ids += o
            mask += [0] * len(o)
        assert ids[: len(prefix)] == prefix  # the prefix is always preserved
    return ids, mask, blocks


CALL = Message(
    role="assistant",
    content="Let me run it.",
    tool_calls=[ToolCall(id="call_0", name="python", arguments={"code": "print(2+2)"})],
)
TURNS = [
    (CALL, [Message(role="tool", content="4", tool_call_id="call_0", name="python")]),
    (
        Message(role="assistant", content="", tool_calls=[CALL.tool_calls[0]] * 2),
        [Message(role="tool", content="4"), Message(role="tool", content="also 4")],
    ),
    (Message(role="assistant", content="<answer>4</answer>"), []),
]


@pytest.mark.parametrize("tok", ["qwen_tokenizer", "qwen2_tokenizer"])
def test_prompt_is_the_template_rendering(tok, request):
    t = request.getfixturevalue(tok)
    r = Renderer(t, TOOLS)
    text = t.apply_chat_template(
        [m.to_template() for m in START], tools=TOOLS, tokenize=False, add_generation_prompt=True
    )
    assert r.prompt_ids(START) == t.encode(text, add_special_tokens=False)
    assert text.endswith("<|im_start|>assistant\n") and "<tools>" in text


def test_incremental_ids_equal_full_rerender_for_a_stable_template(qwen2_tokenizer):
    r = Renderer(qwen2_tokenizer, TOOLS)
    ids, _, _ = conversation(r, TURNS)
    history = START + [m for a, obs in TURNS for m in [a, *obs]]
    full = r.encode(r.render(history))
    assert ids == full[: len(ids)] and full[len(ids) :] == r.encode(r.separator)


def test_delta_is_what_the_template_renders_for_those_messages(qwen_tokenizer):
    r = Renderer(qwen_tokenizer, TOOLS)
    obs = [Message(role="tool", content="4"), Message(role="tool", content="x y")]
    got = r.decode(r.observation_ids(obs, [r.eot_id]))
    assert got == (
        "\n<|im_start|>user\n<tool_response>\n4\n</tool_response>\n"
        "<tool_response>\nx y\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
    )
    assert r.observation_ids(obs, [r.eot_id]) == r.encode(got)


def test_loss_mask_is_one_exactly_on_sampled_tokens(qwen_tokenizer):
    r = Renderer(qwen_tokenizer, TOOLS)
    ids, mask, blocks = conversation(r, TURNS)
    sampled = [i for i, m in zip(ids, mask, strict=True) if m]
    expect = [t for a, _ in TURNS for t in sampled_ids(r, a)]
    assert sampled == expect
    for start, block in blocks:  # observation blocks are masked and sit exactly there
        assert ids[start : start + len(block)] == block
        assert mask[start : start + len(block)] == [0] * len(block)


def test_think_dropping_template_never_touches_sampled_ids(qwen_tokenizer):
    r = Renderer(qwen_tokenizer, TOOLS)
    think = Message(role="assistant", content="<think>\nplan: add\n</think>\n\n" + CALL.content,
                    tool_calls=CALL.tool_calls)  # fmt: skip
    turns = [
        (think, [Message(role="tool", content="4")]),
        (think, [Message(role="user", content="Now 3+3?")]),  # a new user query
        (Message(role="assistant", content="<answer>6</answer>"), []),
    ]
    ids, mask, _ = conversation(r, turns)
    history = START + [m for a, obs in turns for m in [a, *obs]]
    rerender = r.render(history)
    # the template drops the earlier <think> blocks when re-rendering …
    assert rerender.count("<think>") == 0
    # … but the trajectory keeps both sampled think blocks, id for id
    assert r.decode(ids).count("<think>\nplan: add\n</think>") == 2
    sampled = [i for i, m in zip(ids, mask, strict=True) if m]
    assert sampled == [t for a, _ in turns for t in sampled_ids(r, a)]


@pytest.mark.parametrize("content", ["ing", "ly.", "'s", "  x", "\n\nfoo", "é", "\ud83d\ude00"[:1]])
def test_tool_output_never_merges_with_previous_tokens(qwen2_tokenizer, content):
    r = Renderer(qwen2_tokenizer, TOOLS)
    s = r.encode("test<|im_end|>")
    obs = r.observation_ids([Message(role="tool", content=content)], s)
    ids = s + obs
    assert ids[: len(s)] == s
    assert obs == r.encode(r.separator + r.delta_text([Message(role="tool", content=content)]))


def test_turn_not_ended_by_eot_gets_a_masked_eot(qwen_tokenizer):
    r = Renderer(qwen_tokenizer, TOOLS)
    obs = r.observation_ids([Message(role="tool", content="4")], r.encode("hi<|endoftext|>"))
    assert obs[0] == r.eot_id


@pytest.mark.parametrize("tok", ["qwen_tokenizer", "qwen2_tokenizer"])
def test_a_turn_cut_at_a_stop_string_gets_its_eot_and_the_delta_whole(tok, request):
    """A ReAct agent's stop string ("Observation:") or a length cut ends a turn on a text token.
    Taken as the turn's end marker, its last look-alike in the template's rendering cut the delta
    there: the model read "Observation: 2, 2", which no one sent (a red-team pass)."""
    r = Renderer(request.getfixturevalue(tok), TOOLS)
    sampled = r.encode("Thought: add them\nAction: add\nAction Input: 2, 2\nObservation:")
    user = Message(role="user", content="Observation: 4")
    obs = r.observation_ids([user], sampled)
    assert obs[0] == r.eot_id  # supplied (masked)
    assert r.decode(obs[1:]) == r.separator + r.delta_text([user])


def test_truncate_counts_tokens(qwen_tokenizer):
    r = Renderer(qwen_tokenizer, TOOLS)
    text, cut = r.truncate("word " * 100, 10)
    assert cut == len(r.encode("word " * 100)) - 10
    assert text.startswith("word word") and "truncated" in text
    assert r.truncate("short", 10) == ("short", 0)


def test_memoized_ids_are_the_same_ids_and_fresh_lists(qwen_tokenizer):
    """`Renderer.encoded` (a group's first prompt, turn-end tags, stop ids) tokenizes a text once:
    the same ids as encoding it again, in a list of the caller's own."""
    r = Renderer(qwen_tokenizer)
    msgs = [Message(role="user", content="What is 2 + 3? <|im_end|> stays text")]
    first = r.prompt_ids(msgs, memo=True)
    assert first == r.prompt_ids(msgs)
    first.append(-1)
    assert r.prompt_ids(msgs, memo=True) == r.prompt_ids(msgs)
    tag = r.encoded("<|im_end|>")
    tag.clear()
    assert r.encoded("<|im_end|>") == r.encode("<|im_end|>") == [r.eot_id]


def test_an_observation_is_rendered_twice_when_its_content_is_written_verbatim(
    qwen_tokenizer, monkeypatch
):
    """A and B1 (the module docstring's renderings) show where B2 would part from B1 when the
    template writes the message's content where B1 has the sentinel: B2 is not rendered. A
    content that cannot show it (empty, or starting as the sentinel does) renders B2 too. The
    ids are the reference path's (Renderer(fast=False) renders all three) either way."""
    fast, ref = Renderer(qwen_tokenizer, TOOLS), Renderer(qwen_tokenizer, TOOLS, fast=False)
    template, calls = fast.template, []
    monkeypatch.setattr(fast, "template", lambda m, gen: calls.append(gen) or template(m, gen))
    sampled = fast.encode("Let me run it.<|im_end|>")
    for content, renders in [("4", 2), ("  x\n", 2), ("", 3), ("\u27e6 x", 3)]:
        calls.clear()
        obs = [Message(role="tool", content=content), Message(role="user", content="go on")]
        assert fast.observation_ids(obs, sampled) == ref.observation_ids(obs, sampled)
        assert len(calls) == renders, content


def test_the_content_is_placed_from_b1_only_on_evidence():
    """`content_prefix`: the sentinel once in B1, A the same up to it, A's content there."""
    s = "\u27e61"
    b1 = f"<a>x<end>\n<tool>{s}</tool>"
    full = "<a>x<end>\n<tool>ok</tool><gen>"
    assert content_prefix(b1, full, "ok", s) == b1[: b1.index(s)]
    assert content_prefix(b1, full, "no", s) is None  # A does not hold the content there
    assert content_prefix(b1, full.replace("<tool>", "<tool n=2>"), "ok", s) is None  # nor B1's
    assert content_prefix(b1 + s, full, "ok", s) is None  # the sentinel twice
    assert content_prefix(b1.replace(s, "?"), full, "ok", s) is None  # not at all
    assert content_prefix(b1, full.replace("ok", "\u27e6k"), "\u27e6k", s) is None  # as it starts
    assert content_prefix(b1, full, "", s) is None
