"""Checks on the service's error bodies, shared by the limit tests."""

from typing import Any

import httpx


def error_body(response: httpx.Response, status: int) -> dict[str, Any]:
    """The error body of ``response``, in OpenAI's shape, after checking its status."""
    assert response.status_code == status, response.text
    error: dict[str, Any] = response.json()["error"]
    assert isinstance(error["message"], str) and error["message"]
    assert error["code"] == status and isinstance(error["type"], str)
    return error
