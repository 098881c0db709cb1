"""Checks on the service's error bodies, shared by the limit tests."""

from typing import Any

import httpx

#: OpenAI's ``error.type`` for each status the service answers with.
ERROR_TYPES = {
    **dict.fromkeys((400, 401, 404, 413, 422), "invalid_request_error"),
    429: "rate_limit_error",
    **dict.fromkeys((500, 502, 503, 504), "server_error"),
}


def error_body(response: httpx.Response, status: int) -> dict[str, Any]:
    """The error body of ``response``, in OpenAI's shape, after checking its status."""
    assert response.status_code == status, response.text
    error: dict[str, Any] = response.json()["error"]
    assert isinstance(error["message"], str) and error["message"]
    assert error["code"] == status and error["type"] == ERROR_TYPES[status]
    return error
