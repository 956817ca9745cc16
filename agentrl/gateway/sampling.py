"""A request's sampling settings, and what the engine samples with.

Under rollout.gateway.sampling=run (training) the engine samples every request with the run's
rollout.temperature/top_p/top_k, the distribution the learner scores. A request's own settings:

    temperature, top_p      ignored and counted (gateway/sampling_overridden): frameworks send
                            them unasked, and the learner divides by rollout.temperature alone
    presence_penalty, frequency_penalty, repetition_penalty, top_k, min_p
                            refused (a 400 naming the parameter) unless neutral or the run's
                            own: each changes the distribution sampled, and answering as if it
                            were honored would train on another one than the agent asked for
    seed                    ignored on purpose: the run seeds each request (trainer.deterministic);
                            an agent's fixed seed would give every sample of a group one answer

Under rollout.gateway.sampling=request (`agentrl gateway`, previews) every one is honored: the
engine's sampling_params (SGLang's, which the dev server implements alike, penalties included).
The vLLM/SGLang extensions (top_k, min_p, repetition_penalty) come at the top level of the body,
where the openai SDK's `extra_body` puts them."""

from __future__ import annotations

import json
from dataclasses import dataclass, field, fields, replace
from typing import Any

from agentrl.engine import SamplingParams
from agentrl.gateway.errors import WireError, bad


@dataclass
class GenerationDefaults:
    """What the run samples with (rollout.*): every request's defaults and limits."""

    max_new_tokens: int = 256
    max_context_tokens: int = 2048
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False  # benchmarks: every request samples its max_tokens
    template_kwargs: dict[str, Any] = field(default_factory=dict)
    end_of_turn: str | None = None
    # rollout.thinking: keep (the ids as sampled) or template (each request's ids are the chat
    # template's rendering of its messages: a history it renders otherwise starts a new sequence)
    thinking: str = "keep"


RANGES = {  # OpenAI's where OpenAI has the parameter, else SGLang's (a top_p of 0 is no
    # distribution at all): what the engine is handed under sampling=request
    "temperature": (lambda v: 0 <= v <= 2, "from 0 to 2"),
    "top_p": (lambda v: 0 < v <= 1, "above 0 and at most 1"),
    "min_p": (lambda v: 0 <= v <= 1, "from 0 to 1"),
    "presence_penalty": (lambda v: -2 <= v <= 2, "from -2 to 2"),
    "frequency_penalty": (lambda v: -2 <= v <= 2, "from -2 to 2"),
    "repetition_penalty": (lambda v: 0 < v <= 2, "above 0 and at most 2"),
}
NEUTRAL = {"min_p": 0.0, "presence_penalty": 0.0, "frequency_penalty": 0.0,
           "repetition_penalty": 1.0}  # fmt: skip


@dataclass(frozen=True)
class Knobs:
    """The sampling settings a request named (None: left out, or null)."""

    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    repetition_penalty: float | None = None
    seed: int | None = None


def number_of(body: dict[str, Any], key: str) -> float | None:
    """A sampling number within its range (NaN or infinity would reach the engine)."""
    v = body.get(key)
    if v is None:
        return None
    inside, says = RANGES[key]
    if isinstance(v, bool) or not isinstance(v, int | float) or not inside(v):
        raise bad(f"`{key}` must be a number {says}, got {json.dumps(v)}")
    return float(v)


def _integer(body: dict[str, Any], key: str, ok: Any, says: str) -> int | None:
    v = body.get(key)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int) or not ok(v):
        raise bad(f"`{key}` must be {says}, got {json.dumps(v)}")
    return v


def read_knobs(body: dict[str, Any]) -> Knobs:
    """The request's sampling settings, each checked against its range."""
    numbers = {k: number_of(body, k) for k in RANGES}
    top_k = _integer(body, "top_k", lambda v: v == -1 or v >= 1, "-1 (off) or an integer >= 1")
    seed = _integer(body, "seed", lambda v: -(2**63) <= v < 2**63, "a 64-bit integer")
    return Knobs(top_k=top_k, seed=seed, **numbers)


def refuse_in_run(knobs: Knobs, defaults: GenerationDefaults) -> None:
    """Under sampling=run: a setting that would change the distribution sampled, other than
    temperature/top_p (ignored and counted), is a 400 naming it and the setting."""
    run = {**NEUTRAL, "top_k": defaults.top_k}
    for f in fields(Knobs):
        v = getattr(knobs, f.name)
        if f.name in run and v is not None and v != run[f.name]:
            raise WireError(
                400,
                "unsupported_parameter",
                f"`{f.name}`={json.dumps(v)} is refused under rollout.gateway.sampling=run: "
                "it would sample another distribution than the one the learner scores (the "
                f"run's {f.name} is {json.dumps(run[f.name])}). Leave it out, or use "
                "rollout.gateway.sampling=request outside training (`agentrl gateway`)",
                param=f.name,
            )


def sampling_params(
    knobs: Knobs,
    own: bool,
    defaults: GenerationDefaults,
    max_new_tokens: int,
    seed: int | None,
    choice: int = 0,
) -> SamplingParams:
    """What the engine samples with: the run's settings, or under sampling=request (`own`) the
    request's where it named them. `seed`: the run's for this sample; a request's own seed is
    the request's, as OpenAI's: its `choice`-th sample (of `n`) samples with seed + choice,
    so the n answers are not one answer n times."""
    d = defaults
    if knobs.seed is not None:
        knobs = replace(knobs, seed=(knobs.seed + choice + 2**63) % 2**64 - 2**63)

    def pick(name: str, run: Any) -> Any:
        v = getattr(knobs, name)
        return v if own and v is not None else run

    return SamplingParams(
        seed=pick("seed", seed),
        max_new_tokens=max_new_tokens,
        temperature=pick("temperature", d.temperature),
        top_p=pick("top_p", d.top_p),
        top_k=pick("top_k", d.top_k),
        min_p=pick("min_p", 0.0),
        presence_penalty=pick("presence_penalty", 0.0),
        frequency_penalty=pick("frequency_penalty", 0.0),
        repetition_penalty=pick("repetition_penalty", 1.0),
        stop_token_ids=list(d.stop_token_ids),
        ignore_eos=d.ignore_eos,
    )


def refuse_other_template(asked: dict[str, Any], defaults: GenerationDefaults) -> None:
    """A chat-template variable the request asked for (reasoning_effort, chat_template_kwargs)
    that is not the run's is a 400: every request is rendered with rollout.template_kwargs,
    and answering as if it were honored would have the model read another prompt."""
    run = defaults.template_kwargs
    for key, value in asked.items():
        if key not in run or run[key] != value:
            said = json.dumps(run[key]) if key in run else "not set"
            raise bad(
                f"the request asks the chat template for {key}={json.dumps(value)}; every "
                f"request is rendered with the run's rollout.template_kwargs ({key}: {said}). "
                f"Leave it out of the request, or set rollout.template_kwargs.{key}",
                "unsupported_parameter",
                "reasoning_effort" if key == "reasoning_effort" else "chat_template_kwargs",
            )
