"""The gateway's pure parts: OpenAI requests read or refused with the reason (agentrl/gateway/
wire.py), and which sequence a request continues (agentrl/gateway/capture.py), on the shipped
tiny model's tokenizer and chat template with completions written as ids."""

from __future__ import annotations

import pytest
from gateway_post import post_once
from transformers import AutoTokenizer

from agentrl.assets.build import resolve_builtin
from agentrl.gateway import EpisodeCapture, WireError
from agentrl.gateway.wire import message_body, parse_request, stream_chunks
from agentrl.parsers import get_parser
from agentrl.render import Renderer
from agentrl.sequence import record_turn
from agentrl.types import Completion, FinishReason, Message

TOOLS = [{"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}]
USER = {"role": "user", "content": "What is 1 + 2?"}


@pytest.mark.parametrize(
    ("body", "says"),
    [
        ({"messages": []}, "non-empty list"),
        ({"messages": [{"role": "robot", "content": "x"}]}, "role must be one of"),
        ({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, "text only"),
        (
            {
                "messages": [
                    USER,
                    {
                        "role": "assistant",
                        "tool_calls": [
                            {"id": "c", "function": {"name": "add", "arguments": "{oops"}}
                        ],
                    },
                    {"role": "tool", "tool_call_id": "c", "content": "3"},
                ]
            },
            "arguments are not JSON",
        ),  # fmt: skip
        ({"messages": [USER], "tool_choice": "required", "tools": TOOLS}, "tool_choice"),
        ({"messages": [USER], "response_format": {"type": "json_object"}}, "structured outputs"),
        ({"messages": [USER, {"role": "assistant", "content": "The answer is"}]}, "prefilling"),
        ({"messages": [USER], "n": 0}, "`n` must be an integer >= 1"),
        ({"messages": [USER], "tools": [{"type": "function"}]}, "tools[0]"),
        ({"messages": [{"role": "tool", "content": "3"}]}, "tool_call_id"),
        ([1, 2], "JSON object"),
        # sampling=request hands these to the engine: NaN, infinity, top_p 0 or past 1 never
        ({"messages": [USER], "temperature": float("nan")}, "`temperature` must be a number"),
        ({"messages": [USER], "temperature": float("inf")}, "from 0 to 2"),
        ({"messages": [USER], "top_p": 0}, "`top_p` must be a number above 0"),
        ({"messages": [USER], "top_p": 1.5}, "at most 1"),
        ({"messages": [USER], "stream": "false"}, "`stream` must be true or false"),
        # answered with `logprobs: null`, an agent that asked for them read nothing
        ({"messages": [USER], "logprobs": True}, "logprobs are not returned"),
        ({"messages": [USER], "logprobs": True, "top_logprobs": 3}, "logprobs are not returned"),
    ],
)
def test_requests_the_gateway_cannot_serve_are_400s_that_say_why(body, says):
    with pytest.raises(WireError) as e:
        parse_request(body)
    assert e.value.status == 400 and says in e.value.message
    assert e.value.body()["error"]["type"] == "invalid_request_error"


def test_a_request_is_read_as_frameworks_send_it():
    req = parse_request({
        "model": "gpt-4o", "messages": [
            {"role": "developer", "content": [{"type": "text", "text": "Be brief."}]}, USER,
            {"role": "assistant", "content": None, "tool_calls": [{"id": "c1", "type": "function",
             "function": {"name": "add", "arguments": "{\"a\": 1, \"b\": 2}"}}]},
            {"role": "tool", "tool_call_id": "c1", "content": "3"}],
        "tools": TOOLS, "max_completion_tokens": 9, "stop": "\n\n", "stream": True,
        "stream_options": {"include_usage": True}, "temperature": 0.2, "parallel_tool_calls": True,
        "user": "u", "metadata": {"k": "v"}, "logprobs": False, "top_logprobs": 0,
    })  # fmt: skip
    assert [m.role for m in req.messages] == ["system", "user", "assistant", "tool"]
    assert req.messages[0].content == "Be brief." and req.messages[2].content == ""
    assert req.messages[2].tool_calls[0].arguments == {"a": 1, "b": 2}
    assert req.messages[3].name == "add"  # named after the call it answers
    assert (req.max_tokens, req.stop, req.stream, req.include_usage) == (9, ["\n\n"], True, True)
    body = message_body(req.messages[2])
    assert body["content"] is None and body["tool_calls"][0]["function"]["arguments"] == (
        '{"a": 1, "b": 2}'
    )


@pytest.fixture(scope="module")
def kit():
    tok = AutoTokenizer.from_pretrained(resolve_builtin("tiny"))
    return tok, Renderer(tok, TOOLS), get_parser("hermes")


def answer(kit, ep: EpisodeCapture, messages: list[Message], text: str):
    """Serve one request as the gateway does, the engine's answer given as `text`."""
    tok, renderer, parser = kit
    plan = ep.plan(messages, "k", renderer)
    cap = ep.commit(plan)
    ids = tok.encode(text + "<|im_end|>", add_special_tokens=False)
    turn, said = record_turn(cap.seq, Completion(ids, [-0.5] * len(ids), FinishReason.STOP),
                             renderer, parser, None, len(cap.seq.turns))  # fmt: skip
    ep.sampled(cap, turn)
    return plan.kind, said.message, cap


def test_retries_and_second_continuations_branch_and_keep_the_shared_ids(kit):
    ep = EpisodeCapture("t", 0, "s", None)
    first = [Message(role="user", content="What is 1 + 2?")]
    kind, said, cap = answer(
        kit, ep, first, '<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>'
    )
    assert kind == "start" and said.tool_calls[0].name == "add"
    result = Message(role="tool", content="3", tool_call_id=said.tool_calls[0].id, name="add")
    kind, _, same = answer(kit, ep, [*first, said, result], "3")
    assert kind == "extend" and same is cap and len(cap.seq.turns) == 2
    # the same continuation again (a retry): a branch from the first turn, sharing its ids
    kind, _, other = answer(kit, ep, [*first, said, result], "It is 3")
    assert kind == "branch" and other is not cap
    end = cap.seq.turns[0].obs_end
    # … as its prompt: the shared ids as they were sampled, mask 0 (trained once, in `cap`)
    assert other.seq.ids[:end] == cap.seq.ids[:end] and other.seq.prompt_len == end
    assert other.seq.mask == [0] * end + [1] * (len(other.seq.ids) - end)
    assert len(other.seq.turns) == 1 and other.seq.turns[0].start == end
    # the first request again: the agent started over, same messages → a new start is a fork
    kind, _, _ = answer(kit, ep, first, "3")
    assert kind == "fork"
    # an echoed assistant message that differs from what was answered → fork, never re-tokenized
    edited = said.model_copy(update={"content": "let me add"})
    kind, _, forked = answer(kit, ep, [*first, edited, result], "3")
    assert (
        kind == "fork" and forked.seq.mask[: forked.seq.prompt_len] == [0] * forked.seq.prompt_len
    )
    assert ep.counts == {"start": 1, "extend": 1, "branch": 1, "fork": 2}


def test_stream_chunks_end_with_the_finish_reason_and_usage():
    from agentrl.gateway.wire import Choice
    from agentrl.types import ToolCall

    msg = Message(
        role="assistant", content="", tool_calls=[ToolCall(id="c", name="add", arguments={"a": 1})]
    )
    chunks = stream_chunks("id", "m", [Choice(msg, "tool_calls")], {"total_tokens": 3})
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    assert chunks[1]["choices"][0]["delta"]["tool_calls"][0]["function"]["name"] == "add"
    assert chunks[-2]["choices"][0]["finish_reason"] == "tool_calls"
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"] == {"total_tokens": 3}


def test_a_streamed_answer_carries_what_the_whole_answer_does():
    """A red-team pass: a streamed answer left out the turn's reasoning_content, which the same
    answer unstreamed carries; an agent that streams never saw (or echoed) its reasoning."""
    from agentrl.gateway.wire import Choice
    from agentrl.types import ToolCall

    msg = Message(role="assistant", content="Adding.", reasoning_content="1 + 2 is 3",
                  tool_calls=[ToolCall(id="c", name="add", arguments={"a": 1})])  # fmt: skip
    deltas = [
        c["choices"][0]["delta"] for c in stream_chunks("id", "m", [Choice(msg, "stop")], None)
    ]
    joined: dict = {}
    for d in deltas:
        for k, v in d.items():
            joined[k] = joined.get(k, "") + v if isinstance(v, str) else v
    whole = message_body(msg)
    assert joined["reasoning_content"] == whole["reasoning_content"] == "1 + 2 is 3"
    assert joined["content"] == whole["content"] and joined["role"] == "assistant"
    assert [c["function"] for c in joined["tool_calls"]] == [
        c["function"] for c in whole["tool_calls"]
    ]


def test_responses_input_items_become_the_messages_a_chat_request_has():
    from agentrl.gateway.responses import parse_responses_request

    req = parse_responses_request({
        "model": "m", "instructions": "Be brief.", "tools": [{"type": "function", "name": "add",
        "parameters": {"type": "object"}, "strict": True}], "input": [
            {"role": "user", "content": "What is 1 + 2?"},
            {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Adding."}]},
            {"type": "function_call", "call_id": "c1", "name": "add", "arguments": '{"a": 1, "b": 2}'},
            {"type": "function_call", "call_id": "c2", "name": "add", "arguments": '{"a": 0, "b": 0}'},
            {"type": "function_call_output", "call_id": "c1", "output": "3"},
            {"type": "function_call_output", "call_id": "c2", "output": "0"},
            {"type": "reasoning", "summary": []}],
        "max_output_tokens": 7})  # fmt: skip
    assert [m.role for m in req.messages] == ["system", "user", "assistant", "tool", "tool"]
    said = req.messages[2]
    assert said.content == "Adding." and [c.id for c in said.tool_calls] == ["c1", "c2"]
    assert req.messages[3].name == "add" and req.max_tokens == 7
    assert req.tools[0]["function"]["name"] == "add"
    for body, says in (({"input": "x", "previous_response_id": "r"}, "whole history"),
                       ({"input": "x", "stream": True}, "streaming"),
                       ({"input": "x", "tools": [{"type": "web_search"}]}, "only function tools"),
                       ({"input": [{"type": "computer_call"}]}, "not supported"),
                       ({"input": "x", "temperature": float("nan")}, "temperature"),
                       ({"input": "x", "top_logprobs": 2}, "logprobs are not returned"),
                       ({"input": "x", "include": ["message.output_text.logprobs"]},
                        "logprobs are not returned")):  # fmt: skip
        with pytest.raises(WireError, match=says):
            parse_responses_request(body)


def test_parallel_function_calls_without_text_are_one_assistant_turn():
    from agentrl.gateway.responses import parse_responses_request

    calls = [{"type": "function_call", "call_id": f"c{i}", "name": "add", "arguments": "{}"}
             for i in (1, 2)]  # fmt: skip
    outs = [{"type": "function_call_output", "call_id": f"c{i}", "output": "0"} for i in (1, 2)]
    req = parse_responses_request({"input": [{"role": "user", "content": "x"}, *calls, *outs]})
    assert [m.role for m in req.messages] == ["user", "assistant", "tool", "tool"]
    assert [c.id for c in req.messages[1].tool_calls] == ["c1", "c2"]


def test_an_answers_reasoning_comes_back_apart_from_its_content():
    """As an OpenAI-compatible server with a reasoning parser answers: the <think> block the
    parser set apart is `reasoning_content`, never part of `content`."""
    from agentrl.types import Message

    said = get_parser("hermes").parse_turn("<think>add them</think>\n\n42")
    body = message_body(Message(role="assistant", content=said.content,
                                reasoning_content=said.reasoning))  # fmt: skip
    assert body["content"] == "42" and body["reasoning_content"] == "add them"
    assert "reasoning_content" not in message_body(Message(role="assistant", content="42"))


def test_bodies_json_cannot_read_are_400s_never_500s(kit):
    """A red-team pass: JSON nested past Python's recursion limit, an integer of 5000 digits
    and a charset Python does not know were 500s (an SDK retries those) and no bad request of
    the episode; each is the agent's 400 that says why."""
    import asyncio

    import httpx

    from agentrl.gateway import Gateway

    tok, _, parser = kit
    bodies = {
        b"[" * 100_000: ("application/json", "RecursionError"),
        b'{"messages": [], "n": 1' + b"0" * 5000 + b"}": ("application/json", "ValueError"),
        b'{"messages": []}': ("application/json; charset=nope", "LookupError"),
        b'{"messages": [{"role": "user", "content": "\xff"}]}': ("application/json", "utf-8"),
    }

    async def go():
        gw = Gateway(None, tok, parser)  # no request gets as far as the engine
        url = await gw.start()
        ep = gw.open("t", 0, "s")
        try:
            async with httpx.AsyncClient() as http:
                for raw, (kind, says) in bodies.items():
                    headers = {"Authorization": f"Bearer {ep.key}", "Content-Type": kind}
                    r = await http.post(f"{url}/chat/completions", content=raw, headers=headers)
                    assert r.status_code == 400 and says in r.json()["error"]["message"], r.text
        finally:
            await gw.aclose()
        return ep

    assert asyncio.run(go()).counts["bad_requests"] == len(bodies)


def test_a_body_no_history_that_fits_could_make_is_refused_unread(kit):
    """A red-team pass: a 7.5 MB message (under the old fixed 8 MB limit) was tokenized for
    33 s in the event loop every episode shares before its context_length_exceeded. The body
    limit now follows rollout.max_context_tokens (64 bytes a token, 1 MiB at least): past it the
    request is refused unread, and the episode ends as context_overflow, as for a long prompt."""
    import asyncio

    from agentrl.gateway import Gateway
    from agentrl.gateway.limits import body_limit
    from agentrl.gateway.server import GenerationDefaults
    from agentrl.types import StopReason

    assert body_limit(2048) == 1 << 20 and body_limit(131072) == 64 * 131072
    tok, _, parser = kit
    content = "x" * (3 << 19)  # 1.5 MiB

    gw = Gateway(None, tok, parser, defaults=GenerationDefaults(max_context_tokens=2048))
    body = {"messages": [{"role": "user", "content": content}]}
    ep, r = asyncio.run(post_once(gw, body))
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["code"] == "context_length_exceeded" and "1048576 bytes" in error["message"]
    assert ep.stop is StopReason.CONTEXT_OVERFLOW and ep.counts["bad_requests"] == 1


def test_text_far_past_the_context_is_refused_after_one_contexts_tokenizing(kit, monkeypatch):
    """A body under `body_limit` can still hold far more tokens than the context: 900 KB of
    one-character tokens at 2,048 tokens was tokenized whole (1.8 s at 2 MB, in the event loop
    every episode shares) before its refusal. The text is now counted a chunk at a time and
    refused once past the context; ordinary text is never counted."""
    import asyncio

    from agentrl.gateway import Gateway
    from agentrl.gateway.limits import COUNT_CHUNK_CHARS
    from agentrl.gateway.server import GenerationDefaults
    from agentrl.types import StopReason

    tok, _, parser = kit
    counted: list[int] = []
    real = Renderer.encode_text
    monkeypatch.setattr(Renderer, "encode_text", lambda r, t: counted.append(len(t)) or real(r, t))

    gw = Gateway(None, tok, parser, defaults=GenerationDefaults(max_context_tokens=2048))
    body = {"messages": [USER, {"role": "user", "content": "a b " * 225_000}]}  # 900 KB
    ep, r = asyncio.run(post_once(gw, body))
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["code"] == "context_length_exceeded" and "tokens of text" in error["message"]
    assert ep.stop is StopReason.CONTEXT_OVERFLOW
    assert sum(counted) <= 2 * COUNT_CHUNK_CHARS  # the first chunk passed 2,048 tokens

    counted.clear()  # ordinary text: not counted (the renderer tokenizes it once, as before)
    gw = Gateway(None, tok, parser, defaults=GenerationDefaults(max_context_tokens=2048))
    tokens_past = __import__("agentrl.gateway.limits", fromlist=["x"]).tokens_past
    assert tokens_past(gw._renderer([])[0], [Message(role="user", content="a b " * 5000)], 2048)
    assert (
        tokens_past(gw._renderer([])[0], [Message(role="user", content="hello " * 10)], 2048)
        is None
    )


def test_an_answer_to_a_request_without_tools_is_text(kit):
    """A red-team pass: under tool_choice none (the tools in the prompt, calls refused) the model
    may still write a call; it was answered as `tool_calls`, finish `tool_calls`, to an agent that
    offered no tool. OpenAI answers text: the call stays in the content, the ids as sampled."""
    import asyncio

    from agentrl.gateway import Gateway

    tok, _, parser = kit
    text = '<tool_call>\n{"name": "python", "arguments": {"code": "1"}}\n</tool_call>'
    ids = tok.encode(text + "<|im_end|>", add_special_tokens=False)

    class Canned:  # the engine's answer fixed: the model's choice is what is under test
        async def generate(self, input_ids, params, key=None):
            return Completion(list(ids), [-0.5] * len(ids), FinishReason.STOP)

    def go(choice):
        body = {"messages": [{"role": "user", "content": "hi"}], "tools": TOOLS,
                "tool_choice": choice}  # fmt: skip
        ep, r = asyncio.run(post_once(Gateway(Canned(), tok, parser), body))
        return ep, r.json()["choices"][0]

    ep, none = go("none")
    assert none["finish_reason"] == "stop" and not none["message"].get("tool_calls")
    assert none["message"]["content"] == text
    (cap,) = ep.trained()
    assert cap.seq.ids[cap.seq.turns[0].start :] == ids  # recorded as sampled
    _, auto = go("auto")
    assert auto["finish_reason"] == "tool_calls" and auto["message"]["tool_calls"]


def test_tool_choice_none_keeps_the_tools_in_the_prompt_and_extends_the_episode(kit):
    """tool_choice none (an agent forcing its final answer after a tool result) left the tools
    out of the prompt: the model read another prompt than the agent sent (OpenAI's keeps the
    tools), and the request forked a second sequence, the whole history rendered again. The
    tools stay: the request extends the sequence that called the tool, its answer is text."""
    import asyncio

    from agentrl.gateway import Gateway

    tok, _, parser = kit
    call = '<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>'
    answers = [tok.encode(t + "<|im_end|>", add_special_tokens=False) for t in (call, call)]
    prompts: list[list[int]] = []

    class Scripted:  # the engine's answers fixed: a call, then a call again (under none)
        async def generate(self, input_ids, params, key=None):
            prompts.append(list(input_ids))
            ids = answers[len(prompts) - 1]
            return Completion(list(ids), [-0.5] * len(ids), FinishReason.STOP)

    gw = Gateway(Scripted(), tok, parser)
    ep = gw.open("t", 0, "s")
    first = [USER]
    (choice,), _ = asyncio.run(gw.complete(ep, parse_request({"messages": first, "tools": TOOLS})))
    said = message_body(choice.message)
    result = {"role": "tool", "tool_call_id": said["tool_calls"][0]["id"], "content": "3"}
    body = {"messages": [*first, said, result], "tools": TOOLS, "tool_choice": "none"}
    (choice,), _ = asyncio.run(gw.complete(ep, parse_request(body)))
    assert choice.finish == "stop" and not choice.message.tool_calls  # text, as OpenAI answers
    assert ep.counts["extend"] == 1 and ep.counts.get("fork", 0) == 0
    (cap,) = ep.trained()
    assert len(cap.seq.turns) == 2 and prompts[1][: len(prompts[0])] == prompts[0]
