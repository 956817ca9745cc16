"""Token-exact capture of one agent episode: which training sequence a request continues, and
the ids to sample from.

An episode is a set of sequences. Each holds the messages as the gateway knows them (the
request's, and the assistant messages it answered with), its ids, mask and logprobs
(agentrl/sequence.py) and a mark after each sampled turn. A request is matched against them:

    start   the episode's first request: a new sequence from the rendered prompt
    extend  its messages are a sequence's messages up to its last turn, then only new
            non-assistant messages (tool results, a user's reply): the earlier ids stay as they
            were sampled and only the new messages are rendered, as the template's delta after
            that turn (agentrl/render.py), mask 0
    branch  the same, but from an earlier turn of a sequence (a retry, `n` > 1, an agent that
            runs two continuations of one history), or from the last turn of one that is
            answering another request right now: a new sequence whose prompt is the ids up to
            that turn (as sampled; mask 0 here, they are trained in the sequence that sampled
            them), then the delta
    fork    anything else, i.e. the agent rewrote its history (dropped, summarised, reordered or
            edited a message, changed the system prompt or the tools, wrote an assistant message
            itself): a new sequence from the whole request rendered as a prompt. Nothing the
            model sampled is ever tokenized again from text: the new sequence's earlier
            assistant turns are prompt (mask 0), its sampled tokens are those sampled in it.
    template  rollout.thinking=template, and an extend or a branch whose ids would not be the
            chat template's rendering of the history (the messages it matched, with the
            reasoning they were answered with, and the new ones): a thinking template drops an
            earlier answer's reasoning once a user message follows it. A new sequence from that
            rendering, as inference serves it and as a ToolEnv episode goes on under that
            setting (agentrl/rollout.py; docs/rollouts.md). Under keep (the default) the ids
            stay as sampled, reasoning included.

An assistant message in a request is matched against the one the gateway answered with by its
content (whitespace at the ends aside), its tool calls' ids, names and arguments.
"""

from __future__ import annotations

import asyncio
import secrets
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Literal

from agentrl.render import Renderer
from agentrl.sequence import TokenSequence
from agentrl.types import Message, StopReason, Turn

Kind = Literal["start", "extend", "branch", "fork", "template"]


@dataclass(frozen=True)
class Mark:
    """A sequence right after a sampled turn: its message count (the assistant message
    included), its id count, its turn count."""

    messages: int
    ids: int
    turns: int


@dataclass
class Captured:
    """One training sequence of an episode."""

    seq: TokenSequence
    tools_key: str
    origin: Kind
    marks: list[Mark] = field(default_factory=list)
    busy: bool = False  # a request is sampling on it now
    committed: tuple[int, int, int] = (0, 0, 0)  # ids, turns, messages when it was last planned on

    def mark(self) -> None:
        self.marks.append(Mark(len(self.seq.messages), len(self.seq.ids), len(self.seq.turns)))


@dataclass
class Plan:
    """How one request is served before anything changes: the sequence it continues (None:
    a new one), from which mark, the new messages and the ids they add."""

    kind: Kind
    base: Captured | None
    mark: Mark | None
    messages: list[Message]
    new_ids: list[int]
    tools_key: str

    @property
    def length(self) -> int:
        """Ids the engine reads for this request."""
        return (self.mark.ids if self.mark else 0) + len(self.new_ids)


def same_message(ours: Message, theirs: Message) -> bool:
    if ours.role != theirs.role:
        return False
    if ours.role == "assistant":
        calls = [(c.id, c.name, c.arguments) for c in ours.tool_calls]
        return ours.content.strip() == theirs.content.strip() and calls == [
            (c.id, c.name, c.arguments) for c in theirs.tool_calls
        ]
    return ours.content == theirs.content and ours.tool_call_id == theirs.tool_call_id


def common_prefix(ours: list[Message], theirs: list[Message]) -> int:
    n = 0
    for a, b in zip(ours, theirs, strict=False):
        if not same_message(a, b):
            break
        n += 1
    return n


class EpisodeCapture:
    """The sequences of one agent episode and what it has spent. Its `key` is the bearer token
    the agent's client sends: requests are attributed by it, never by their text."""

    def __init__(self, task_id: str, sample_index: int, session: str, seeds: str | None) -> None:
        self.key = "ep-" + secrets.token_urlsafe(24)
        self.task_id, self.sample_index, self.session, self.seeds = (
            task_id,
            sample_index,
            session,
            seeds,
        )
        self.sequences: list[Captured] = []
        self.counts: Counter[str] = Counter()  # start/extend/branch/fork, bad requests, …
        self.requests = 0  # chat completions answered or refused for a budget
        self.sampled_tokens = 0
        self.stop: StopReason | None = None  # set by a budget or the engine: the outcome
        self.error: str | None = None
        self.closed = False
        # the sequence of the agent's latest answer (its reward's, its cut the episode's
        # truncation): choices[0]'s of the request answered last (`answered`), or the one a
        # later request went on from (an extend), never whichever of `n` samples ended last
        self.last: Captured | None = None
        self.reserved = 0  # tokens the requests in flight may still sample
        self.inflight: set[asyncio.Task[Any]] = set()  # requests being served

    def call_id(self) -> str:
        """A tool call id no other call of this episode has (the parser numbers calls per turn;
        the OpenAI Agents SDK, for one, refuses an id it saw before)."""
        self.counts["tool_calls"] += 1
        return f"call_{self.counts['tool_calls']}"

    def flag(self, stop: StopReason, error: str) -> None:
        """The first reason the episode cannot go on wins (a budget, a lost engine)."""
        if self.stop is None:
            self.stop, self.error = stop, error

    # -- matching ------------------------------------------------------------------------------

    def plan(
        self, messages: list[Message], tools_key: str, renderer: Renderer, template: bool = False
    ) -> Plan:
        """Where this request goes (see the module docstring); nothing changes yet. `template`:
        rollout.thinking=template (the ids a request samples on are the template's rendering)."""
        best: tuple[int, int, Captured, Mark] | None = None
        for order, cap in enumerate(self.sequences):
            if cap.tools_key != tools_key or not cap.marks:
                continue
            shared = common_prefix(cap.seq.messages, messages)
            usable = [m for m in cap.marks if m.messages <= shared]
            if not usable:
                continue
            mark = usable[-1]
            rest = messages[mark.messages :]
            if not rest or any(m.role == "assistant" for m in rest):
                continue
            if best is None or (mark.messages, order) > (best[0], best[1]):
                best = (mark.messages, order, cap, mark)
        if best is None:  # the first request's samples all start; later, a rewrite forks
            kind: Kind = "fork" if any(c.marks for c in self.sequences) else "start"
            return Plan(kind, None, None, messages, renderer.prompt_ids(messages), tools_key)
        _, _, cap, mark = best
        turn = cap.seq.turns[mark.turns - 1]
        sampled = cap.seq.ids[turn.start : turn.end]
        new = messages[mark.messages :]
        ids = renderer.observation_ids(new, sampled, cap.seq.messages[mark.messages - 1])
        if template:  # the history as the template renders it (the reasoning as answered)
            history = cap.seq.messages[: mark.messages] + new
            if (fresh := renderer.prompt_ids(history)) != cap.seq.ids[: mark.ids] + ids:
                return Plan("template", None, None, history, fresh, tools_key)
        last = mark == cap.marks[-1] and not cap.busy
        return Plan("extend" if last else "branch", cap, mark, new, ids, tools_key)

    def again(self, plan: Plan) -> Plan:
        """The plan of another sample of the request `plan` was made for, as `plan` would place
        it once that one is committed: the same ids (rendered once, not once a sample), on a
        sequence of its own: a branch from the same turn, or a new one as that one is."""
        kind: Kind = "branch" if plan.base is not None else plan.kind
        return Plan(kind, plan.base, plan.mark, plan.messages, list(plan.new_ids), plan.tools_key)

    def commit(self, plan: Plan) -> Captured:
        """Apply the plan: the sequence to sample on, its new ids appended, marked busy. A
        branch's prompt is the ids it shares with its base (as sampled, mask 0: they are
        trained in the base) and the new messages' delta."""
        self.counts[plan.kind] += 1
        if plan.kind == "extend":
            assert plan.base is not None
            cap = plan.base
            turn = cap.seq.turns[-1]
            cap.seq.messages += plan.messages
            cap.seq.append(plan.new_ids, None)
            turn.observations = list(plan.messages)
            turn.obs_end = len(cap.seq.ids)
            self.last = cap  # the agent went on from its answer, whatever choice that was
        else:
            shared: list[int] = []
            messages = list(plan.messages)
            if plan.base is not None and plan.mark is not None:  # a branch
                shared = plan.base.seq.ids[: plan.mark.ids]
                messages = plan.base.seq.messages[: plan.mark.messages] + messages
            seq = TokenSequence(messages=messages)
            seq.append(shared + plan.new_ids, None)
            seq.prompt_len = len(seq.ids)
            cap = Captured(seq, plan.tools_key, plan.kind)
            self.sequences.append(cap)
        cap.busy = True
        cap.committed = (len(cap.seq.ids), len(cap.seq.turns), len(cap.seq.messages))
        return cap

    def undo(self, cap: Captured, plan: Plan) -> None:
        """The request failed before anything was sampled: its sequence goes back as it was
        (a new one is dropped), so a retry matches the same way."""
        cap.busy = False
        self.counts[plan.kind] -= 1
        self.counts["failed"] += 1
        if plan.kind != "extend":
            self.sequences.remove(cap)
            return
        s, (ids, turns, messages) = cap.seq, cap.committed  # a turn half recorded goes too
        del s.turns[turns:]
        del s.messages[messages - len(plan.messages) :]
        n = ids - len(plan.new_ids)
        del s.ids[n:], s.mask[n:], s.logprobs[n:]
        s.turns[-1].obs_end, s.turns[-1].observations = s.turns[-1].end, []

    def sampled(self, cap: Captured, turn: Turn) -> None:
        """A turn was recorded on `cap` (agentrl.sequence.record_turn)."""
        self.sampled_tokens += turn.end - turn.start
        cap.mark()
        cap.busy = False

    def answered(self, caps: list[Captured]) -> None:
        """A request's `n` samples were all recorded on `caps`, in choice order: the agent's
        answer is choices[0] (agents take it by convention) whichever sample ended last; a
        later request that goes on from another choice extends that one (`commit`)."""
        self.last = caps[0]

    def trained(self) -> list[Captured]:
        """The sequences that sampled something, in the order they began."""
        return [c for c in self.sequences if c.seq.turns]
