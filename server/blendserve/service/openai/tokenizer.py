"""vLLM's tokenizer endpoints, passed through to the upstream that has them.

Evaluation clients (lm-evaluation-harness's ``tokenizer_backend=remote``) ask
the server root for ``GET /tokenizer_info``, ``POST /tokenize`` and
``POST /detokenize``. blendserve has no tokenizer of its own: each request
goes to the upstream unchanged, and an engine or upstream without the
endpoint is a 404 that says so.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Body, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from blendserve.engines.base import Engine
from blendserve.engines.passthrough import PassThrough
from blendserve.service.errors import error_body, error_responses

__all__ = ["router"]

router = APIRouter()

_Json = Annotated[dict[str, Any], Body()]
_RESPONSES: dict[int | str, dict[str, Any]] = {
    200: {"description": "the upstream's reply, unchanged"},
    **error_responses(401, 404, 422, 503),
}


async def _ask(request: Request, path: str, body: dict[str, Any] | None) -> Response:
    engine: Engine = request.app.state.engine
    reply = await engine.tokenizer(path, body) if isinstance(engine, PassThrough) else None
    if reply is None:
        message = f"the {engine.name} engine has no tokenizer: {path} needs an upstream"
        return JSONResponse(error_body(message, "invalid_request_error", 404), 404)
    if reply.status == 404:
        message = (
            f"the upstream has no {path} (vLLM serves /tokenize and /detokenize, and "
            "/tokenizer_info with --enable-tokenizer-info-endpoint)"
        )
        return JSONResponse(error_body(message, "invalid_request_error", 404), 404)
    return StreamingResponse(reply.body, status_code=reply.status, media_type=reply.content_type)


@router.get("/tokenizer_info", responses=_RESPONSES)
async def tokenizer_info(request: Request) -> Response:
    """The upstream's tokenizer configuration (vLLM: eos/bos tokens, chat template)."""
    return await _ask(request, "/tokenizer_info", None)


@router.post("/tokenize", responses=_RESPONSES)
async def tokenize(request: Request, body: _Json) -> Response:
    """Token ids of a prompt or messages, from the upstream's tokenizer."""
    return await _ask(request, "/tokenize", body)


@router.post("/detokenize", responses=_RESPONSES)
async def detokenize(request: Request, body: _Json) -> Response:
    """The text of token ids, from the upstream's tokenizer."""
    return await _ask(request, "/detokenize", body)
