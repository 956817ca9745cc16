"""train, preview and gateway drop the HTTP clients' INFO line per request, the openai SDK's
included: an AgentEnv's agent calls the gateway through it, and the docs' AddAgent printed 100
`[httpx2][INFO] - HTTP Request: POST …` lines a step between the step lines."""

from __future__ import annotations

import logging

import openai._base_client as sdk
import pytest

from agentrl.cli.logs import HTTP_LOGGERS, quiet_third_party


@pytest.fixture(autouse=True)
def _own_env(monkeypatch):
    """quiet_third_party sets WANDB_DISABLE_WEAVE in os.environ: undone after each test."""
    monkeypatch.setenv("WANDB_DISABLE_WEAVE", "unset")
    monkeypatch.delenv("WANDB_DISABLE_WEAVE")


def test_the_openai_sdks_http_logger_is_quieted():
    http = getattr(sdk, "httpx2", None) or sdk.httpx  # the SDK's HTTP library (3.x: its fork)
    assert http.__name__.split(".")[0] in HTTP_LOGGERS
    logging.getLogger(http.__name__).setLevel(logging.NOTSET)
    logging.getLogger().setLevel(logging.INFO)  # as Hydra's job logging sets it
    quiet_third_party()
    for name in HTTP_LOGGERS:
        log = logging.getLogger(name)
        assert not log.isEnabledFor(logging.INFO) and log.isEnabledFor(logging.WARNING)


def test_wandbs_weave_suggestion_is_off_unless_asked_for(monkeypatch, capsys):
    """Every run printed `wandb: Detected [openai] in use. Use W&B Weave …` (3 lines)."""
    from wandb.integration.weave import weave

    quiet_third_party()
    assert weave._is_weave_disabled()
    weave.init_weave_if_imported("me", "agentrl")
    assert "Weave" not in capsys.readouterr().err
    monkeypatch.setenv("WANDB_DISABLE_WEAVE", "false")  # the user's own setting stands
    quiet_third_party()
    assert not weave._is_weave_disabled()
