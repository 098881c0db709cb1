"""vLLM's tokenizer endpoints, passed through to the upstream that has them.

Evaluation clients (lm-evaluation-harness's ``tokenizer_backend=remote``) ask
the server root for them; blendserve has no tokenizer of its own. Each
request holds a job slot while it runs, and its body has a limit of its own,
so that tokenizer calls cannot hold up every other route.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from blendserve.engines.passthrough import PassThrough
from blendserve.errors import InvalidRequest
from blendserve.service.admission import admitted
from blendserve.service.errors import error_body, error_responses
from blendserve.service.json_depth import deep_field, deep_field_in, depth_message
from blendserve.service.json_text import unencodable_field, unencodable_message
from blendserve.service.limits import LARGE_BODY_BYTES, NO_SAMPLES
from blendserve.service.state import service_of

__all__ = ["TOKENIZER_BODY_PATHS", "router"]

router = APIRouter()

#: The routes that take a body (their own body limit applies).
TOKENIZER_BODY_PATHS = ("/tokenize", "/detokenize")

_RESPONSES: dict[int | str, dict[str, Any]] = {
    200: {"description": "the upstream's reply, unchanged"},
    **error_responses(401, 404, 413, 422, 429, 503),
}
_JSON_BODY: dict[str, Any] = {
    "requestBody": {
        "required": True,
        "content": {"application/json": {"schema": {"type": "object"}}},
    }
}


async def _json_object(request: Request) -> dict[str, Any]:
    """The body as a JSON object, parsed in a thread when large.

    Raises:
        InvalidRequest: not a JSON object, nested too deep, or holding a lone surrogate.
    """
    raw = await request.body()
    try:
        if len(raw) < LARGE_BODY_BYTES:
            value = json.loads(raw)
        else:
            value = await asyncio.to_thread(json.loads, raw)
    except RecursionError:
        value = None
        param = deep_field_in(raw)
    except ValueError as exc:
        raise InvalidRequest(f"the body is not JSON: {exc}") from None
    else:
        param = deep_field(value)
    if param is not None:
        raise InvalidRequest(depth_message(), param=param or None)
    if not isinstance(value, dict):
        raise InvalidRequest("the body must be a JSON object")
    param = unencodable_field(value)
    if param is not None:
        raise InvalidRequest(f"{param}: {unencodable_message()}", param=param)
    return value


async def _ask(request: Request, path: str, body: dict[str, Any] | None) -> Response:
    engine = service_of(request).engine
    async with admitted(request, {}, NO_SAMPLES, param="body") as held:
        asked = engine.tokenizer(path, body) if isinstance(engine, PassThrough) else None
        reply = await held.wait(asked) if asked is not None else None
        if reply is None:
            message = f"the {engine.name} engine has no tokenizer: {path} needs an upstream"
            return JSONResponse(error_body(message, 404), 404)
        if reply.status == 404:
            message = (
                f"the upstream has no {path} (vLLM serves /tokenize and /detokenize, and "
                "/tokenizer_info with --enable-tokenizer-info-endpoint)"
            )
            return JSONResponse(error_body(message, 404), 404)
        return held.stream(reply.body, status_code=reply.status, media_type=reply.content_type)


@router.get("/tokenizer_info", responses=_RESPONSES)
async def tokenizer_info(request: Request) -> Response:
    """The upstream's tokenizer configuration (vLLM: eos/bos tokens, chat template)."""
    return await _ask(request, "/tokenizer_info", None)


@router.post("/tokenize", responses=_RESPONSES, openapi_extra=_JSON_BODY)
async def tokenize(request: Request) -> Response:
    """Token ids of a prompt or messages, from the upstream's tokenizer."""
    return await _ask(request, "/tokenize", await _json_object(request))


@router.post("/detokenize", responses=_RESPONSES, openapi_extra=_JSON_BODY)
async def detokenize(request: Request) -> Response:
    """The text of token ids, from the upstream's tokenizer."""
    return await _ask(request, "/detokenize", await _json_object(request))
