"""Log levels the entry points set: one INFO line per HTTP request is noise on the console."""

from __future__ import annotations

import logging

# httpx: agentrl's own clients; httpx2: the openai SDK's (3.x) fork of it, which an AgentEnv's
# agent calls the gateway through (one INFO line per request: 100 a step in the docs' example)
HTTP_LOGGERS = ("httpx", "httpx2")


def quiet_http_logs() -> None:
    """Keep the HTTP clients' warnings and errors, drop their line per request."""
    for name in HTTP_LOGGERS:
        logging.getLogger(name).setLevel(logging.WARNING)
