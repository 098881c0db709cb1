"""Headers, errors and server-sent events (shared by both clients)."""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

import httpx

from blendserve_client.errors import APIError


def headers(api_key: str | None) -> dict[str, str]:
    """Request headers, with the bearer key when given."""
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


def raise_for_error(response: httpx.Response) -> None:
    """Raises :class:`APIError` with the server's message for a non-2xx response."""
    if response.is_success:
        return
    message, param = response.text, None
    try:
        error = response.json().get("error", {})
        message, param = error.get("message", message), error.get("param")
    except (json.JSONDecodeError, AttributeError):
        pass
    raise APIError(response.status_code, message, param)


class SSEParser:
    """Incremental parser of ``event:``/``data:`` frames."""

    def __init__(self) -> None:
        self._event = "message"
        self._data: list[str] = []

    def feed(self, lines: Iterable[str]) -> list[tuple[str, dict[str, Any]]]:
        """Consumes lines, returns completed ``(event, data)`` frames."""
        frames = []
        for line in lines:
            if not line:
                if self._data:
                    frames.append((self._event, json.loads("\n".join(self._data))))
                self._event, self._data = "message", []
            elif line.startswith("event:"):
                self._event = line[6:].strip()
            elif line.startswith("data:"):
                self._data.append(line[5:].lstrip())
        return frames
