"""Where the sampled answer ends, when the request ends it before the engine did: at a `stop`
string (chat completions' `stop`), or after the first tool call (`parallel_tool_calls: false`).

The engine samples to its own end (an end of turn, max_tokens); the gateway cuts the ids at the
first token whose text completes a stop string, or the first tool call, as OpenAI's answer ends
there. The ids, their logprobs, weight-version segments and routed experts are cut alike: what
is trained is what the agent was answered with, never the ids sampled past it. A prefix of a
sample is a sample of that prefix (each id was drawn given the ids before it only), so the kept
ids are exactly what an engine told to stop there would have sampled."""

from __future__ import annotations

import dataclasses

from agentrl.parsers import Parser
from agentrl.parsers.base import THINK, ParseErrorKind
from agentrl.render import Renderer
from agentrl.types import Completion, FinishReason


def cut_at_stop(
    comp: Completion, stop: list[str], renderer: Renderer, prompt_len: int
) -> tuple[Completion, str | None]:
    """The request's `stop` strings: the sampled ids up to the first token whose text completes
    one (that token kept: ids are never split), finish reason stop; and the stop string found.
    The ids after it were never shown to the agent and are not trained on, nor their routes
    (learner.routing_replay: the routes of the `prompt_len` + kept ids but the last)."""
    text = renderer.decode(comp.token_ids) if stop and comp.token_ids else ""
    found = [(text.find(s), s) for s in stop if s in text]
    if not found:
        return comp, None
    at, first = min(found)
    upto = text[: at + len(first)]
    # the fewest ids whose text holds the stop string whole: by the text, not its length (ids
    # that end inside a character decode to a U+FFFD as long as the character they begin, and
    # a cut there ended the answer mid-character, the stop string never sampled)
    lo, hi = 1, len(comp.token_ids)
    while lo < hi:
        mid = (lo + hi) // 2
        if renderer.decode(comp.token_ids[:mid]).startswith(upto):
            hi = mid
        else:
            lo = mid + 1
    # a stop string its last id completes is the answer's end too: finish stop, not the length
    # cut the engine saw there (its turn would have been the episode's truncation)
    return cut_at(comp, lo, prompt_len), first


def cut_at(comp: Completion, keep: int, prompt_len: int) -> Completion:
    """The completion's first `keep` ids, finish reason stop; their logprobs, weight-version
    segments and routes (learner.routing_replay: those of the `prompt_len` + kept ids but the
    last) with them."""
    segs: list[tuple[int, str]] = []
    for n, v in comp.segments:
        room = keep - sum(m for m, _ in segs)
        if room > 0:
            segs.append((min(n, room), v))
    routes = comp.routed_experts
    if routes is not None and routes.size % (prompt_len + len(comp.token_ids) - 1) == 0:
        width = routes.size // (prompt_len + len(comp.token_ids) - 1)  # layers * experts
        routes = routes[: (prompt_len + keep - 1) * width]  # causal: the kept positions' are as is
    return dataclasses.replace(
        comp, token_ids=comp.token_ids[:keep], logprobs=comp.logprobs[:keep],
        finish_reason=FinishReason.STOP, matched_stop=None, segments=segs, routed_experts=routes,
    )  # fmt: skip


class CallCutError(ValueError):
    """The first tool call cannot be kept alone: the id that completes it completes another."""


def cut_to_one_call(
    comp: Completion, renderer: Renderer, parser: Parser, prompt_len: int
) -> Completion | None:
    """`parallel_tool_calls: false`: a turn with more than one tool call ends at the id that
    completes the first (OpenAI's model makes one call at most). None: nothing to cut. Dropping
    the later calls from the answer alone (vLLM's way) would train ids the agent never saw, and
    its echo would fork the episode; here the answer is the parse of the kept ids, as every
    answer is, so what the agent reads and echoes next turn is what is trained. The turn ends
    unclosed (no end of turn sampled): the next request's delta supplies it, masked, as after a
    stop string. `CallCutError` where one id completes two calls (a call is many ids: never
    seen), so that no cut keeps exactly one."""
    ids = comp.token_ids
    thought = THINK[1] in renderer.assistant_text(ids)  # the turn reasoned, then answered

    def calls(k: int) -> int:  # calls the first k ids make (a turn past the template's: 2)
        text = renderer.assistant_text(ids[:k])
        if thought and THINK[1] not in text:  # a call drafted while thinking is no call (the
            return 0  # prompt opened the <think>: the unclosed block is not set apart)
        res = parser.parse_turn(text)
        if any(e.kind is ParseErrorKind.TOO_MANY_CALLS for e in res.errors):
            return 2
        return len(res.tool_calls)

    if calls(len(ids)) <= 1:
        return None
    lo, hi = 1, len(ids)  # the fewest ids that make a call: a call once made stays made
    while lo < hi:
        mid = (lo + hi) // 2
        if calls(mid) >= 1:
            hi = mid
        else:
            lo = mid + 1
    if calls(lo) != 1:
        raise CallCutError(
            f"the id that completes this turn's first tool call (id {lo} of {len(ids)}) "
            f"completes {calls(lo)} calls: no cut keeps exactly one (parallel_tool_calls false)"
        )
    return cut_at(comp, lo, prompt_len)
