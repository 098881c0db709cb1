"""Builds ``/solve`` bodies and reads server-sent events (shared by both clients)."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import httpx

from blendserve_client.errors import APIError

QuestionLike = str | Mapping[str, Any]


def solve_body(
    questions: Sequence[QuestionLike],
    *,
    budget: int | None,
    budget_per_question: float | None,
    policy: str | None,
    answer: Mapping[str, Any] | str | None,
    sampling: Mapping[str, Any] | None,
    model: str | None,
    settle_delta: float,
    concurrency: int | None,
    confidence: float | None,
    max_samples_per_question: int | None,
    stream: bool,
) -> dict[str, Any]:
    """The JSON body; a plain string question is a prompt.

    ``policy`` None is the service's default. With ``confidence`` the default
    ``settle_delta`` stays out (a quality target has none; others go, for the
    service to refuse).
    """
    body: dict[str, Any] = {
        "questions": [{"prompt": q} if isinstance(q, str) else dict(q) for q in questions],
        "stream": stream,
    }
    if policy is not None:
        body["policy"] = policy
    if confidence is None or settle_delta != 0.0:
        body["settle_delta"] = settle_delta
    if budget is not None:
        body["budget"] = budget
    if budget_per_question is not None:
        body["budget_per_question"] = budget_per_question
    if answer is not None:
        body["answer"] = {"kind": answer} if isinstance(answer, str) else dict(answer)
    optional = (
        ("sampling", sampling),
        ("model", model),
        ("concurrency", concurrency),
        ("confidence", confidence),
        ("max_samples_per_question", max_samples_per_question),
    )
    for name, value in optional:
        if value is not None:
            body[name] = dict(value) if isinstance(value, Mapping) else value
    return body


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
