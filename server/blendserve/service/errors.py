"""The one place that maps blendserve errors to HTTP status codes and one body shape."""

from __future__ import annotations

import re

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError as FastAPIValidationError
from fastapi.responses import JSONResponse

from blendserve.errors import (
    BlendserveError,
    EngineError,
    EngineProtocolError,
    EngineTimeout,
    EngineUnavailable,
    RequestValidationError,
    ServiceOverloaded,
)

__all__ = ["error_body", "install_error_handlers", "status_for"]

_ADDRESS = re.compile(r" at 0x[0-9a-f]+")


def status_for(exc: BaseException) -> int:
    """HTTP status for an exception raised below the service."""
    if isinstance(exc, RequestValidationError):
        return 422
    if isinstance(exc, ServiceOverloaded):
        return 429
    if isinstance(exc, EngineTimeout):
        return 504
    if isinstance(exc, (EngineUnavailable, EngineProtocolError, EngineError)):
        return 502 if isinstance(exc, EngineProtocolError) else 503
    return 500


def error_body(message: str, type_: str, code: int, param: str | None = None) -> dict[str, object]:
    """OpenAI's error shape, used by every route: ``{"error": {...}}``."""
    error: dict[str, object] = {"message": _ADDRESS.sub("", message), "type": type_, "code": code}
    if param is not None:
        error["param"] = param
    return {"error": error}


async def _blendserve_error(request: Request, exc: Exception) -> JSONResponse:
    status = status_for(exc)
    param = getattr(exc, "param", None)
    headers = {"Retry-After": str(exc.retry_after)} if isinstance(exc, ServiceOverloaded) else None
    body = error_body(str(exc), type(exc).__name__, status, param)
    return JSONResponse(body, status, headers=headers)


async def _validation_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, FastAPIValidationError)
    first = exc.errors()[0] if exc.errors() else {"loc": (), "msg": "invalid request"}
    param = ".".join(str(part) for part in first["loc"] if part != "body") or None
    message = f"{param}: {first['msg']}" if param else str(first["msg"])
    return JSONResponse(error_body(message, "invalid_request_error", 422, param), 422)


def install_error_handlers(app: FastAPI) -> None:
    """Registers the handlers that turn exceptions into error bodies."""
    app.add_exception_handler(BlendserveError, _blendserve_error)
    app.add_exception_handler(FastAPIValidationError, _validation_error)
