"""The engine wing: everything between agentrl and the rollout servers. Other packages import only
what this file exports; the modules behind it are private to agentrl/engine/.

    client.py    EngineClient: `gen` (Generation, the data plane: routing, retries, abort) and
                 `control` (Control, admin.py: health, versions, pause, memory, LoRA, weights)
    http.py      one place for HTTP: the session per loop, the servers' marks, the fan-out; a
                 server's `Endpoint` and blocking admin posts for a learner rank
    protocol.py  the wire format: sampling params, responses, error bodies and their errors
    config.py    EngineConfig (the `engine.*` settings) and the servers' Bearer token
    gate.py      the push gate: /generate waits while weights change; cut turns go on
    coalesce.py  concurrent /generate calls to one server leave as one request
    fleet.py     launch, health-wait, restart and stop servers (local, Ray)
    checks.py    what a run checks of its servers: deterministic, decoding past their CUDA graphs
    router.py    SGLang's model gateway (smg) in front of several servers
    dev/         the CPU engine, `python -m agentrl.engine.dev` (never imported from outside)
"""

from agentrl.engine.admin import Control
from agentrl.engine.checks import check_deterministic, warn_uncaptured
from agentrl.engine.client import EngineClient, Generation
from agentrl.engine.config import (
    API_KEY_ENV,
    DETERMINISTIC,
    RUN_TOKEN,
    EngineConfig,
    default_api_key,
)
from agentrl.engine.fleet import (
    Fleet,
    RayServer,
    launch_engines,
    launch_fleet,
)
from agentrl.engine.gpus import split_local_gpus, visible_gpus
from agentrl.engine.http import Endpoint, backoff_delay, health_probe, post_admin, post_each
from agentrl.engine.protocol import (
    ROUTING_KEY_HEADER,
    EngineError,
    EngineProtocolError,
    EngineRequestError,
    EngineUnavailable,
    PromptTooLong,
    SamplingParams,
    encode_named_tensors,
    parse_generate_response,
)
from agentrl.engine.router import launch_router

__all__ = [
    "API_KEY_ENV", "DETERMINISTIC", "ROUTING_KEY_HEADER", "RUN_TOKEN", "Control", "EngineClient",
    "Endpoint", "EngineConfig", "EngineError", "EngineProtocolError", "EngineRequestError",
    "EngineUnavailable", "Fleet", "Generation", "PromptTooLong", "RayServer", "SamplingParams", "backoff_delay",
    "default_api_key", "encode_named_tensors", "health_probe", "launch_engines", "launch_fleet",
    "launch_router", "parse_generate_response", "post_admin", "post_each", "split_local_gpus",
    "visible_gpus", "check_deterministic", "warn_uncaptured",
]  # fmt: skip
