"""``GET /health`` and ``GET /v1/models``."""

from __future__ import annotations

import json
import logging
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from blendserve.engines.base import Engine
from blendserve.service.errors import error_responses
from blendserve.service.state import service_of
from blendserve.service.system.schemas import HealthResponse, ModelCard, ModelListResponse

__all__ = ["router"]

_log = logging.getLogger(__name__)

router = APIRouter()

# The kinds of failure describing the cost met: each is logged once, not on every probe.
_cost_failed: set[type[BaseException]] = set()


def _engine(request: Request) -> Engine:
    return service_of(request).engine


def _cost(engine: Engine) -> dict[str, Any] | None:
    """What ``/health`` shows of the engine's step cost; None where it is unknown, or where
    describing it failed: the probes that decide whether the service is up never fail
    for it (each kind of failure is logged once, with its traceback)."""
    if engine.cost is None:
        return None
    try:
        cost = engine.cost.describe()
        json.dumps(cost, allow_nan=False)  # as the response will write it
    except Exception as exc:
        if type(exc) not in _cost_failed:
            _cost_failed.add(type(exc))
            _log.exception("describing the engine's step cost for /health failed")
        return None
    return cost


# HEAD too (load balancers probe so), out of the schema: one operation per path and method.
@router.head("/health", include_in_schema=False)
@router.get("/health", response_model=HealthResponse, responses={503: {"model": HealthResponse}})
async def health(request: Request) -> JSONResponse:
    """200 while the engine can serve, 503 otherwise (``HEAD`` too: load balancers probe so)."""
    engine = _engine(request)
    state = await engine.health()
    body = HealthResponse(
        status="ok" if state.healthy else "unavailable",
        engine=engine.name,
        upstreams=dict(state.upstreams),
        capacity=engine.load().capacity,
        cost=_cost(engine),
        detail=state.detail,
    )
    return JSONResponse(body.model_dump(), status_code=200 if state.healthy else 503)


@router.get("/v1/models", response_model=ModelListResponse, responses=error_responses(401, 503))
async def list_models(request: Request) -> ModelListResponse:
    """The models the engine serves, in OpenAI's format."""
    names = await _engine(request).models()
    return ModelListResponse(data=[ModelCard(id=name) for name in names])
