"""The gateway wing: an OpenAI-compatible endpoint that records token-exact trajectories from an
agent written with any framework (`AgentEnv`, agentrl/agent_env.py). Other packages import only
what this file exports.

    config.py    GatewayConfig (`rollout.gateway.*`: address, per-episode budgets, sampling)
    wire.py      OpenAI's chat-completions format in and out (requests, answers, SSE chunks)
    capture.py   an episode's training sequences: start, extend, branch, fork; token-exact
    stop.py      a request's stop strings: the sampled answer cut where one completes
    sampling.py  a request's sampling settings: refused, ignored or honored
    errors.py    WireError: a refused request as an OpenAI error body
    limits.py    how big a request may be: bytes, messages/calls/tools, text, before the work
    server.py    Gateway: the aiohttp server in the run's event loop, in front of its engines
"""

from agentrl.gateway.capture import Captured, EpisodeCapture
from agentrl.gateway.config import GatewayConfig
from agentrl.gateway.server import Gateway, GenerationDefaults
from agentrl.gateway.wire import WireError

__all__ = ["Captured", "EpisodeCapture", "Gateway", "GatewayConfig", "GenerationDefaults",
           "WireError"]  # fmt: skip
