"""``POST /v1/chat/completions`` and ``POST /v1/completions``: voted answers, drop-in.

Each route parses its body and hands it to :mod:`blendserve.service.openai.serving`.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response

from blendserve.service.errors import error_responses
from blendserve.service.openai.schemas import (
    ChatCompletion,
    ChatCompletionRequest,
    Completion,
    CompletionRequest,
)
from blendserve.service.openai.serving import serve

__all__ = ["router"]

router = APIRouter(prefix="/v1")

_STREAMED: dict[int | str, dict[str, Any]] = {
    200: {"content": {"text/event-stream": {}}, "description": "chunks when streamed"},
    **error_responses(400, 401, 404, 413, 422, 429, 502, 503, 504),
}


@router.post("/chat/completions", response_model=ChatCompletion, responses=_STREAMED)
async def chat_completions(body: ChatCompletionRequest, request: Request) -> Response | Any:
    """A chat completion whose content is a sampled completion with the voted answer.

    ``blendserve`` in the body overrides the server's self-consistency
    settings; ``{"blendserve": {"enabled": false}}`` passes the request upstream.
    ``model`` must be one of ``GET /v1/models`` (else a 404) unless the server
    allows aliases.
    """
    return await serve(request, body)


@router.post("/completions", response_model=Completion, responses=_STREAMED)
async def completions(body: CompletionRequest, request: Request) -> Response | Any:
    """A text completion per prompt (a list of prompts is a batch of questions)."""
    return await serve(request, body)
