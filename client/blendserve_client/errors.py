"""Errors the client raises."""

from __future__ import annotations

__all__ = ["APIError"]


class APIError(Exception):
    """The service answered with an error status.

    Attributes:
        status_code: HTTP status.
        message: the service's message.
        param: the offending request field, when the service named one.
    """

    def __init__(self, status_code: int, message: str, param: str | None = None) -> None:
        super().__init__(f"{status_code}: {message}")
        self.status_code = status_code
        self.message = message
        self.param = param
