"""Long episodes (rollout.context, agentrl/context.py): an episode that outgrows
max_context_tokens goes on in new segments over a rewritten history instead of overflowing; each
segment is token-exact over the prompt the engine was asked with, and every segment of an episode
gets the episode's advantage (computed by hand below)."""

import pytest

from agentrl.advantage import AdvantageConfig, compute_advantages
from agentrl.context import MARKER, trim_tool_outputs
from agentrl.envs.synthetic import FixedLengthEnv
from agentrl.metrics import rollout_metrics
from agentrl.rollout import Rollout, RolloutConfig
from agentrl.types import Completion, FinishReason, Message, StopReason, Task

TASK = Task(id="t0", data={"prompt": "find the value"})


class Long(FixedLengthEnv):
    """Six turns, each answered by a 120-word tool output: about 3x a 500-token context."""

    turns = 6
    observation_words = 120


class Short(FixedLengthEnv):
    turns = 2


class Summarised(Long):
    """rollout.context.policy=env: the env keeps the task and the last turn, with a note."""

    async def compact(self, messages):
        note = Message(role="user", content=f"(notes: {len(messages)} messages so far)")
        return [messages[0], note, *messages[-2:]]


class Engine:
    """Samples a short turn; records every prompt it was asked with."""

    def __init__(self, tok):
        self.tok, self.prompts = tok, []

    async def generate(self, input_ids, params, key=None):
        self.prompts.append(list(input_ids))
        ids = self.tok.encode(f"step {len(self.prompts)}", add_special_tokens=False)
        ids.append(self.tok.eos_token_id)
        return Completion(ids, [-0.25] * len(ids), FinishReason.STOP)


async def episode(tok, env=Long, **context):
    cfg = RolloutConfig(max_context_tokens=500, max_new_tokens=16, context=context or {})
    ro = Rollout(Engine(tok), tok, env, cfg)
    return ro, await ro.run_sequences(TASK)


async def test_without_a_policy_the_long_episode_overflows(qwen_tokenizer):
    _, (t,) = await episode(qwen_tokenizer)
    assert t.stop_reason is StopReason.CONTEXT_OVERFLOW and len(t.turns) < 6


@pytest.mark.parametrize(
    "env,policy", [(Long, "trim_tool_outputs"), (Long, "summarize"), (Summarised, "env")]
)
async def test_a_rewritten_history_goes_on_in_token_exact_segments(qwen_tokenizer, env, policy):
    early = {"compact_at": 0.5} if policy == "summarize" else {}  # room to ask, and answer
    ro, segs = await episode(qwen_tokenizer, env, policy=policy, **early)
    summaries = len(segs) - 1 if policy == "summarize" else 0  # a sampled turn before each
    assert len(segs) > 1 and sum(len(s.turns) for s in segs) == 6 + summaries
    assert all(s.stop_reason is StopReason.COMPLETED for s in segs)
    prompts = iter(ro.engine.prompts)
    for k, s in enumerate(segs):
        s.check()
        assert len(s.token_ids) < 500
        if k:  # a segment starts from the rewritten history, rendered, never sampled
            assert s.metadata["rewrite"][1] == s.prompt_len < s.metadata["rewrite"][0]
            assert s.token_ids[: s.prompt_len] == ro.renderer.prompt_ids(_prompt(s))
            assert sum(s.loss_mask[: s.prompt_len]) == 0
        for turn in s.turns:  # each turn was sampled on exactly the ids before it
            assert next(prompts) == s.token_ids[: turn.start]
            assert s.logprobs[turn.start : turn.end] == [-0.25] * (turn.end - turn.start)
    assert len({s.metadata["session"] for s in segs}) == 1
    if policy == "trim_tool_outputs":
        assert any(MARKER.split("{n}")[0] in m.content for m in segs[-1].messages)
    if policy == "summarize":  # the summary is the model's turn, trained in the segment that
        for s, nxt in zip(segs, segs[1:], strict=False):  # asked; the next goes on from it
            asked, said = s.messages[-2], s.turns[-1]
            assert asked.role == "user" and asked.content.startswith("Your context is nearly")
            assert sum(s.loss_mask[said.start : said.end]) == said.end - said.start
            assert f"Summary of your work so far:\n{said.assistant.content}" in [
                m.content for m in nxt.messages
            ]
    m = rollout_metrics(segs)
    assert m["rollout/rewrites"] == len(segs) - 1
    assert m["rollout/rewrite_tokens_after"] < m["rollout/rewrite_tokens_before"]


def _prompt(seg):
    """The messages a segment's prompt renders: those before its first sampled turn."""
    first = seg.turns[0].assistant
    return seg.messages[: next(i for i, m in enumerate(seg.messages) if m is first)]


async def test_every_segment_gets_its_episodes_advantage(qwen_tokenizer):
    """A group of two episodes, rewards 1 and 0; the first split into segments. GRPO by hand:
    mean 0.5, std (unbiased) 0.7071, so the first episode's advantage is (1 - 0.5) / 0.7071 =
    +0.7071 on every sampled token of every segment, the second's -0.7071: the episode counts
    once in the baseline, not once per segment."""
    _, split = await episode(qwen_tokenizer, policy="trim_tool_outputs")
    _, (whole,) = await episode(qwen_tokenizer, Short)
    for s in split:
        s.reward = 1.0
    whole.reward, whole.metadata["session"] = 0.0, "other"
    out = compute_advantages([[*split, whole]], AdvantageConfig())
    *seg_adv, whole_adv = out.advantages
    for s, a in zip(split, seg_adv, strict=True):
        sampled = a[[bool(x) for x in s.loss_mask]]
        assert sampled.numel() > 0 and sampled.sub(0.7071).abs().max() < 1e-3
    assert whole_adv[[bool(x) for x in whole.loss_mask]].add(0.7071).abs().max() < 1e-3


def test_trimming_keeps_the_last_turns_and_says_what_it_dropped():
    msgs = [Message(role="user", content="task")]
    for i in range(3):
        msgs += [Message(role="assistant", content=f"call {i}"),
                 Message(role="tool", content="x " * 50)]  # fmt: skip
    out = trim_tool_outputs(msgs, 1, lambda t: len(t.split()))
    assert [m.content for m in out if m.role == "tool"] == [MARKER.format(n=50)] * 2 + ["x " * 50]
    assert trim_tool_outputs(out, 1, len) is None  # nothing left to trim: no rewrite


def test_fewer_turns_than_kept_trims_nothing_and_a_summary_keeps_them_all():
    from agentrl.context import summarized

    msgs = [Message(role="system", content="s"), Message(role="user", content="task"),
            Message(role="assistant", content="call"), Message(role="tool", content="out")]  # fmt: skip
    assert trim_tool_outputs(msgs, 2, len) is None
    assert [m.content for m in summarized(msgs, "did x", 3)] == [
        "s", "task", "Summary of your work so far:\ndid x", "call", "out"]  # fmt: skip
    assert [m.content for m in summarized(msgs, "did x", 0)][-1].endswith("did x")


async def test_an_episode_in_segments_is_one_reward_in_the_metrics(qwen_tokenizer):
    _, split = await episode(qwen_tokenizer, policy="trim_tool_outputs")
    _, (whole,) = await episode(qwen_tokenizer, Short)
    for s in split:
        s.reward = 1.0
    whole.reward = 0.0
    m = rollout_metrics([*split, whole])
    assert len(split) > 1 and m["reward/mean"] == 0.5  # not 1.0 weighted by its segments


async def test_the_view_and_the_turn_table_show_a_segment_as_one_of_its_episode(qwen_tokenizer):
    from agentrl.trajectory_view import TURN_COLUMNS, render_html, turn_rows

    _, segs = await episode(qwen_tokenizer, policy="trim_tool_outputs")
    page = render_html([(1, s, None) for s in segs], qwen_tokenizer)
    before, after = segs[1].metadata["rewrite"]
    assert "sequence 0 of its episode" in page
    assert f"sequence 1 of its episode (history rewritten: {before} → {after} tokens)" in page
    rows = [dict(zip(TURN_COLUMNS, r, strict=True)) for r in turn_rows(1, segs)]
    assert [r["sequence"] for r in rows if r["turn"] == 0] == list(range(len(segs)))
    first = next(r for r in rows if r["sequence"] == 1 and r["turn"] == 0)
    assert first["prompt"].startswith(f"(history rewritten: {before} → {after} tokens) ")
