"""A request the gateway refuses, as the OpenAI error body the agent's SDK raises with."""

from __future__ import annotations

from typing import Any


class WireError(Exception):
    """A request the gateway refuses: HTTP `status`, OpenAI error `code`, why, and the request
    field at fault (`param`, where one is)."""

    def __init__(self, status: int, code: str, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.status, self.code, self.message, self.param = status, code, message, param

    def body(self) -> dict[str, Any]:
        kind = "invalid_request_error" if self.status < 500 else "server_error"
        return {
            "error": {"message": self.message, "type": kind, "code": self.code, "param": self.param}
        }


def bad(message: str, code: str = "invalid_request", param: str | None = None) -> WireError:
    return WireError(400, code, message, param)
