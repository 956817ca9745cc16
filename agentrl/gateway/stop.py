"""A request's `stop` strings (chat completions' `stop`): where the sampled answer ends.

The engine samples to its own end (an end of turn, max_tokens); the gateway cuts the ids at the
first token whose text completes a stop string, as OpenAI's answer ends there. The ids, their
logprobs, weight-version segments and routed experts are cut alike: what is trained is what the
agent was answered with, never the ids sampled past it."""

from __future__ import annotations

import dataclasses

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
    segs: list[tuple[int, str]] = []
    for n, v in comp.segments:
        room = lo - sum(m for m, _ in segs)
        if room > 0:
            segs.append((min(n, room), v))
    routes = comp.routed_experts
    if routes is not None and routes.size % (prompt_len + len(comp.token_ids) - 1) == 0:
        width = routes.size // (prompt_len + len(comp.token_ids) - 1)  # layers * experts
        routes = routes[: (prompt_len + lo - 1) * width]  # causal: the kept positions' are as is
    cut = dataclasses.replace(
        comp, token_ids=comp.token_ids[:lo], logprobs=comp.logprobs[:lo],
        finish_reason=FinishReason.STOP, matched_stop=None, segments=segs, routed_experts=routes,
    )  # fmt: skip
    return cut, first
