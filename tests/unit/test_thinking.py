"""rollout.thinking: keep (the sampled ids, one sequence) or template (the chat template's
rendering of the history at every turn; a turn whose history renders otherwise starts a new
sequence). A scripted engine samples a thinking model's turns on real thinking templates:
reasoning, then a qwen3_coder call; reasoning, then the answer."""

import pytest

from agentrl.assets.families import family_tokenizer
from agentrl.config import compose
from agentrl.context import ContextConfig
from agentrl.env import StepResult
from agentrl.envs.code_exec import CodeExecEnv
from agentrl.metrics import rollout_metrics
from agentrl.rollout import Rollout, RolloutConfig
from agentrl.types import Completion, ConfigError, FinishReason, Message, StopReason, Task

TASK = Task(id="t0", data={"prompt": "Compute 874 - 404 * 99.", "answer": "-39122"})
CALL = ("<tool_call>\n<function=python>\n<parameter=code>\nprint(874 - 404 * 99)\n</parameter>\n"
        "</function>\n</tool_call>")  # fmt: skip


class AskAgain(CodeExecEnv):
    """The code_exec task with a user's follow-up after the first answer (a chat that goes on):
    a thinking template drops an answer's reasoning from the history once a user message
    follows it."""

    async def step(self, turn):
        if self.task.data.get("asked"):
            return await super().step(turn)
        self.task.data["asked"] = True
        return StepResult([Message(role="user", content="Sure? Check it once more.")])


class ThinkingEngine:
    """A thinking model's turns: reasoning then a call (`calls`), else reasoning then the
    answer; records each prompt it was asked with."""

    def __init__(self, tok, calls=True):
        self.tok, self.calls, self.prompts = tok, calls, []

    async def generate(self, input_ids, params, key=None):
        self.prompts.append(list(input_ids))
        n = len(self.prompts)
        act = CALL if self.calls and n % 2 == 1 else "<answer>-39122</answer>"
        text = f"Plan {n}: do it.\n</think>\n\n{act}"
        ids = self.tok.encode(text, add_special_tokens=False) + [self.tok.eos_token_id]
        return Completion(ids, [-0.5] * len(ids), FinishReason.STOP, weight_version="1")


@pytest.fixture(scope="module")
def tok():
    return family_tokenizer("qwen3_5_think")  # Qwen3.5: <think> opened by the prompt


async def episode(tok, thinking, env=CodeExecEnv, calls=True):
    task = Task(id="t0", data=dict(TASK.data))
    engine = ThinkingEngine(tok, calls)
    ro = Rollout(engine, tok, env, RolloutConfig(thinking=thinking))
    try:
        return ro, await ro.run_sequences(task)
    finally:
        await ro.aclose()


async def test_keep_trains_the_sampled_ids_as_one_sequence(tok):
    ro, seqs = await episode(tok, "keep", AskAgain, calls=False)
    (t,) = seqs
    assert t.stop_reason is StopReason.COMPLETED and t.reward == 1.0 and len(t.turns) == 2
    # turn 2 was sampled after turn 1's reasoning, as sampled: the prompt is the sequence so far
    assert ro.engine.prompts[1] == t.token_ids[: t.turns[1].start]
    assert "Plan 1" in ro.renderer.decode(ro.engine.prompts[1])
    assert t.turns[0].assistant.reasoning_content == "Plan 1: do it."  # set apart, not content
    assert "Plan 1" not in t.turns[0].assistant.content


async def test_template_renders_the_history_and_trains_each_sequence_on_its_own_turns(tok):
    ro, seqs = await episode(tok, "template", AskAgain, calls=False)
    keep = (await episode(tok, "keep", AskAgain, calls=False))[1][0]
    assert len(seqs) == 2, "Qwen3.5 drops answer 1's reasoning once a user message follows"
    first, second = seqs
    # the second turn read the template's rendering of the history, not the sampled ids
    prompt = ro.renderer.prompt_ids(first.messages)
    assert ro.engine.prompts[1] == prompt == second.token_ids[: second.turns[0].start]
    assert "Plan 1" not in ro.renderer.decode(prompt)  # the template dropped that reasoning
    assert second.prompt_len == len(prompt) and sum(second.loss_mask[: len(prompt)]) == 0
    for t, turns in ((first, keep.turns[:1]), (second, keep.turns[1:])):  # the same samples,
        assert (
            [t.token_ids[x.start : x.end] for x in t.turns]
            == [  # each in its own sequence
                keep.token_ids[x.start : x.end] for x in turns
            ]
        )
        assert sum(t.loss_mask) == sum(x.end - x.start for x in t.turns)
        assert t.reward == 1.0 and t.stop_reason is StopReason.COMPLETED  # the episode's
    assert first.metadata["session"] == second.metadata["session"]  # one episode, one baseline
    assert [t.metadata["sequence"] for t in seqs] == [0, 1]
    m = rollout_metrics(seqs)
    k = rollout_metrics([keep])
    assert m["rollout/sequences_per_episode"] == 2.0 and k["rollout/sequences_per_episode"] == 1.0
    assert m["rollout/sampled_tokens"] == k["rollout/sampled_tokens"]  # trains the same samples
    assert m["rollout/tokens"] > k["rollout/tokens"]  # over more ids: the history twice


async def test_a_tool_loop_the_template_keeps_is_one_sequence_either_way(tok):
    """Within a tool loop (no user message after the call) Qwen3.5 keeps the reasoning: the
    rendering is the sampled ids, so template mode forks nothing."""
    runs = [(await episode(tok, mode))[1] for mode in ("keep", "template")]
    assert [len(s) for s in runs] == [1, 1] and runs[0][0].reward == 1.0
    assert runs[0][0].token_ids == runs[1][0].token_ids


def test_per_turn_credit_needs_one_sequence_per_episode():
    with pytest.raises(ConfigError, match="rollout.thinking=template with algo.advantage"):
        compose(["rollout.thinking=template", "algo.advantage.reward_level=turn"])


class Scripted:
    """Samples `text` (its ids as the tokenizer reads them) every turn."""

    def __init__(self, tok, text):
        self.ids = tok.encode(text, add_special_tokens=False)

    async def generate(self, input_ids, params, key=None):
        return Completion(self.ids, [-0.5] * len(self.ids), FinishReason.STOP, weight_version="1")


async def test_a_turn_the_template_cannot_render_again_is_the_models_parse_error():
    """gpt-oss under rollout.thinking=template: a turn with analysis, a final message and a tool
    call is refused by its template ("Cannot pass both content and thinking…"). The observation
    already said so; re-rendering the history for the next turn raised to the episode boundary,
    `aborted`: out of its group's baseline (a red-team pass). It is the model's parse error."""
    oss = family_tokenizer("gptoss")
    evil = ("<|channel|>analysis<|message|>think<|end|><|start|>assistant<|channel|>final"
            "<|message|>hi<|end|><|start|>assistant<|channel|>commentary to=functions.python "
            '<|constrain|>json<|message|>{"code": "print(1)"}<|call|>')  # fmt: skip
    task = Task(id="t0", data={"prompt": "Compute 40 + 2.", "answer": "42"})
    summarize = ContextConfig(policy="summarize", compact_at=0.01)  # and asking for a summary
    for thinking, context in (("keep", None), ("template", None), ("keep", summarize)):
        cfg = RolloutConfig(thinking=thinking, max_context_tokens=8192, max_turns=3,
                            **({"context": context} if context else {}))  # fmt: skip
        traj = await Rollout(Scripted(oss, evil), oss, CodeExecEnv, cfg).run_episode(task)
        assert not traj.stop_reason.is_infra_failure, (thinking, traj.stop_reason, traj.error)
        assert traj.reward == 0.0
        if thinking == "template" or context:
            assert traj.stop_reason is StopReason.PARSE_ERROR and traj.turns[-1].num_parse_errors
