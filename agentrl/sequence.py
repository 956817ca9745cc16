"""One token sequence in the making: the ids a policy read and sampled, their mask and logprobs,
and its turns. The rollout (agentrl/rollout.py) builds one per episode; the gateway
(agentrl/gateway/) one per training sequence of an agent's episode. Both record a sampled turn
the same way (`record_turn`): the engine's ids appended unchanged (mask 1, their logprobs), the
text decoded and parsed with the run's parser, never tokenized again."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel

from agentrl.env import AssistantTurn
from agentrl.parsers import Parser
from agentrl.render import Renderer
from agentrl.types import Completion, FinishReason, Message, StopReason, Trajectory, Turn


@dataclass
class TokenSequence:
    """A sequence in progress; always consistent, so a failure can still be recorded."""

    ids: list[int] = field(default_factory=list)
    mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    prompt_len: int = 0
    turns: list[Turn] = field(default_factory=list)
    messages: list[Message] = field(default_factory=list)
    # learner.routing_replay: the latest completion's routed experts, [ids[:-1] so far (its
    # prompt and output but the last), layers * k]; each turn's request covers all before it
    routes: Any = None
    # rollout.context: (the prompt's ids before, after) when a rewrite of the history began it
    rewrite: tuple[int, int] | None = None

    def trajectory(
        self,
        task_id: str,
        sample_index: int,
        stop: StopReason,
        error: str | None,
        metadata: dict[str, Any],
    ) -> Trajectory:
        """This sequence as a Trajectory (unscored): its routes, and the rewrite that began it."""
        if self.rewrite:
            metadata = {**metadata, "rewrite": list(self.rewrite)}
        return Trajectory(task_id, sample_index, self.ids, self.mask, self.logprobs,
                          self.prompt_len, self.turns, self.messages, stop, metadata=metadata,
                          error=error, routes=self.routes)  # fmt: skip

    def append(self, ids: list[int], logprobs: list[float] | None) -> None:
        """Sampled ids (with their logprobs: mask 1) or template/observation ids (None: mask 0)."""
        self.ids += ids
        self.mask += [1 if logprobs is not None else 0] * len(ids)
        self.logprobs += logprobs if logprobs is not None else [0.0] * len(ids)


def record_turn(
    seq: TokenSequence,
    comp: Completion,
    renderer: Renderer,
    parser: Parser,
    tool_args: dict[str, type[BaseModel]] | None,
    index: int,
) -> tuple[Turn, AssistantTurn]:
    """Append the engine's completion as the next turn of `seq`: its ids unchanged, its text
    parsed into the assistant message (tool calls checked against `tool_args` when given)."""
    start = len(seq.ids)
    seq.append(comp.token_ids, comp.logprobs)
    if comp.routed_experts is not None:  # prompt + output but the last: len(ids) - 1 positions
        positions = len(seq.ids) - 1
        if positions <= 0 or comp.routed_experts.size % positions:
            raise ValueError(f"routed_experts holds {comp.routed_experts.size} ids for "
                             f"{positions} positions")  # fmt: skip
        seq.routes = comp.routed_experts.reshape(positions, -1)
    text = renderer.assistant_text(comp.token_ids)
    parsed = parser.parse_turn(text, tool_args, truncated=comp.finish_reason is FinishReason.LENGTH)
    msg = Message(role="assistant", content=parsed.content, tool_calls=parsed.tool_calls,
                  reasoning_content=parsed.reasoning)  # fmt: skip
    seq.messages.append(msg)
    turn = Turn(
        start=start,
        end=len(seq.ids),
        obs_end=len(seq.ids),
        weight_version=comp.weight_version,
        finish_reason=comp.finish_reason,
        assistant=msg,
        text=text,
        num_parse_errors=sum(not e.is_call_error for e in parsed.errors),
        gen_latency_s=comp.latency_s,
        prompt_tokens=comp.prompt_tokens or start,
        cached_tokens=comp.cached_tokens,
        segments=list(comp.segments),
    )
    seq.turns.append(turn)
    return turn, AssistantTurn(msg, text, parsed.errors, comp.finish_reason, index)
