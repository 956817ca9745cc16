"""`rollout.gateway.*`: where the gateway listens and what one agent episode may spend."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class GatewayConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    host: str = Field(
        "127.0.0.1",
        description="the gateway's address; loopback by default (agents run on this host)",
    )
    port: int = Field(0, ge=0, le=65535, description="0: a free port, chosen at start")
    max_requests: int = Field(
        32, ge=1, description="chat completions one episode may ask for; past it: 400, max_turns"
    )
    max_sampled_tokens: int = Field(
        8192,
        ge=1,
        description="tokens the model may sample in one episode, over all its requests; each "
        "request's max_tokens is cut to what is left; past it: 400, stop reason length",
    )
    sampling: Literal["run", "request"] = Field(
        "run",
        description="run: every request samples with rollout.temperature/top_p/top_k (the "
        "learner's logprobs assume them); a request's own temperature/top_p are ignored and "
        "counted (gateway/sampling_overridden); its penalties, top_k or min_p are a 400 "
        "(agentrl/gateway/sampling.py). request: the request's are used (`agentrl gateway` "
        "and previews only: training refuses it)",
    )
    agent_workers: int = Field(
        0,
        ge=0,
        le=256,
        description="0: AgentEnv agents run in the rollout's own event loop. N: in N processes "
        "of their own (agentrl/agent_workers.py), so the agents' framework CPU (the SDK building "
        "and parsing each request) does not queue behind the gateway and the engine client; "
        "for agents heavier than a few ms a request, or a fast GPU engine",
    )
