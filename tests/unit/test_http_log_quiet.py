"""train, preview and gateway drop the HTTP clients' INFO line per request, the openai SDK's
included: an AgentEnv's agent calls the gateway through it, and the docs' AddAgent printed 100
`[httpx2][INFO] - HTTP Request: POST …` lines a step between the step lines."""

from __future__ import annotations

import logging

import openai._base_client as sdk

from agentrl.cli.logs import HTTP_LOGGERS, quiet_http_logs


def test_the_openai_sdks_http_logger_is_quieted():
    http = getattr(sdk, "httpx2", None) or sdk.httpx  # the SDK's HTTP library (3.x: its fork)
    assert http.__name__.split(".")[0] in HTTP_LOGGERS
    logging.getLogger(http.__name__).setLevel(logging.NOTSET)
    logging.getLogger().setLevel(logging.INFO)  # as Hydra's job logging sets it
    quiet_http_logs()
    for name in HTTP_LOGGERS:
        log = logging.getLogger(name)
        assert not log.isEnabledFor(logging.INFO) and log.isEnabledFor(logging.WARNING)
