"""The one place that maps blendserve errors to HTTP status codes and one body shape."""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any, Literal

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError as FastAPIValidationError
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, Field
from starlette.exceptions import HTTPException
from starlette.types import Send

from blendserve.errors import (
    BlendserveError,
    EngineError,
    EngineProtocolError,
    EngineTimeout,
    EngineUnavailable,
    InvalidRequest,
    ModelNotFound,
    ServiceOverloaded,
    UpstreamRejected,
)
from blendserve.service.disconnect import ClientGone
from blendserve.service.json_depth import deep_field_in, depth_message

__all__ = [
    "ErrorDetail",
    "ErrorResponse",
    "ErrorType",
    "error_body",
    "error_responses",
    "error_type",
    "install_error_handlers",
    "send_error",
    "status_for",
]

_ADDRESS = re.compile(r" at 0x[0-9a-f]+")

#: OpenAI's ``error.type`` vocabulary, the only types an error body carries.
ErrorType = Literal["invalid_request_error", "rate_limit_error", "server_error"]


def error_type(status: int) -> ErrorType:
    """OpenAI's type of an error answered with ``status`` (a 401 is a bad request, as there)."""
    if status == 429:
        return "rate_limit_error"
    return "server_error" if status >= 500 else "invalid_request_error"


def status_for(exc: BaseException) -> int:
    """HTTP status for an exception raised below the service."""
    if isinstance(exc, ModelNotFound):
        return 404
    if isinstance(exc, InvalidRequest):
        return 422
    if isinstance(exc, ServiceOverloaded):
        return 429
    if isinstance(exc, EngineTimeout):
        return 504
    if isinstance(exc, UpstreamRejected):
        # The caller's request, refused upstream (a parameter it takes no value of, a model
        # it lacks): as it is; the upstream refusing our credentials is ours, a 502.
        return 502 if exc.status in (401, 403, 407) else exc.status
    if isinstance(exc, (EngineUnavailable, EngineProtocolError, EngineError)):
        return 502 if isinstance(exc, EngineProtocolError) else 503
    return 500


class ErrorDetail(BaseModel):
    """What went wrong, as OpenAI reports it."""

    message: str
    type: ErrorType
    code: int | str = Field(description="the HTTP status, or a name such as invalid_api_key")
    param: str | None = Field(None, description="the request field at fault, if one is")


class ErrorResponse(BaseModel):
    """The body of every error response: ``{"error": {...}}``."""

    error: ErrorDetail


_ERROR_DESCRIPTIONS = {
    400: "the body cannot be read (not UTF-8)",
    401: "missing or invalid API key",
    404: "no such endpoint (here, or on the upstream), or no such model "
    '(error.code "model_not_found", error.param "model")',
    413: "request body too large",
    422: "invalid request (the field at fault in error.param)",
    429: "too much work running: retry after Retry-After seconds",
    502: "the engine answered with something unusable",
    503: "the engine is unavailable",
    504: "the engine timed out",
}


def error_responses(*codes: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI ``responses`` declaring ``codes`` with the error body, for a route decorator."""
    return {
        code: {"model": ErrorResponse, "description": _ERROR_DESCRIPTIONS[code]} for code in codes
    }


def error_body(
    message: str, status: int, *, code: int | str | None = None, param: str | None = None
) -> dict[str, object]:
    """OpenAI's error shape, used by every route and middleware: ``{"error": {...}}``.

    ``status`` gives the type, and the code unless ``code`` names the error
    (``model_not_found``); ``param`` is the request field at fault.
    """
    error: dict[str, object] = {
        "message": _ADDRESS.sub("", message),
        "type": error_type(status),
        "code": status if code is None else code,
    }
    if param is not None:
        error["param"] = param
    return {"error": error}


async def send_error(
    send: Send,
    status: int,
    message: str,
    *,
    code: int | str | None = None,
    headers: Sequence[tuple[bytes, bytes]] = (),
) -> None:
    """Answers with :func:`error_body` straight from an ASGI middleware (no route ran);
    ``headers`` go after ``content-type`` and ``content-length``.
    """
    body = error_body(message, status, code=code)
    data = json.dumps(body).encode()
    start = [
        (b"content-type", b"application/json"),
        (b"content-length", b"%d" % len(data)),
        *headers,
    ]
    await send({"type": "http.response.start", "status": status, "headers": start})
    await send({"type": "http.response.body", "body": data})


async def _blendserve_error(request: Request, exc: Exception) -> JSONResponse:
    status = status_for(exc)
    param = getattr(exc, "param", None)
    headers = {"Retry-After": str(exc.retry_after)} if isinstance(exc, ServiceOverloaded) else None
    code = "model_not_found" if isinstance(exc, ModelNotFound) else None  # as OpenAI has it
    return JSONResponse(
        error_body(str(exc), status, code=code, param=param), status, headers=headers
    )


# The tags pydantic adds to a location for the member of a union that failed
# (``stop.str``, ``stop.list[str]``): the field is what the caller sent.
_UNION_TAG = re.compile(r"(str|int|float|bool|none|[a-z]+\[.*\]|function-.*)", re.IGNORECASE)


def _field_path(loc: Sequence[object]) -> list[str]:
    """A validation error's location as the caller's field path: no ``body``, no union tags."""
    parts = [str(part) for part in loc if part != "body"]
    return [p for i, p in enumerate(parts) if not (i and _UNION_TAG.fullmatch(p))]


async def _validation_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, FastAPIValidationError)
    first = exc.errors()[0] if exc.errors() else {"loc": (), "msg": "invalid request"}
    ctx = first.get("ctx")
    named = ctx.get("param") if isinstance(ctx, dict) else None  # a validator named the field
    if isinstance(named, str):
        param: str | None = named
    elif first.get("type") == "json_invalid":  # its loc is a character position, not a field
        param = None
    else:
        param = ".".join(_field_path(first["loc"])) or None
    message = f"{param}: {first['msg']}" if param else str(first["msg"])
    return JSONResponse(error_body(message, 422, param=param), 422)


async def _http_error(request: Request, exc: Exception) -> JSONResponse:
    # Starlette's and FastAPI's own refusals (unreadable body, 404, 405) in the same shape.
    assert isinstance(exc, HTTPException)
    if isinstance(exc.__cause__, RecursionError):  # a body nested too deep for json.loads
        param = deep_field_in(await request.body())
        message = f"{param}: {depth_message()}" if param else depth_message()
        return JSONResponse(error_body(message, 422, param=param or None), 422)
    body = error_body(str(exc.detail), exc.status_code)
    return JSONResponse(body, exc.status_code, headers=exc.headers)


async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
    # A bug: its traceback goes to the log (uvicorn's, re-raised by Starlette), never to
    # the client, who gets the one error contract.
    message = "internal error: the server's log has the details"
    return JSONResponse(error_body(message, 500), 500)


async def _client_gone(request: Request, exc: Exception) -> Response:
    return Response(status_code=499)  # nginx's "client closed request": nobody reads it


def install_error_handlers(app: FastAPI) -> None:
    """Registers the handlers that turn exceptions into error bodies (a gone client: 499)."""
    app.add_exception_handler(ClientGone, _client_gone)
    app.add_exception_handler(BlendserveError, _blendserve_error)
    app.add_exception_handler(HTTPException, _http_error)
    app.add_exception_handler(FastAPIValidationError, _validation_error)
    app.add_exception_handler(Exception, _unexpected)
