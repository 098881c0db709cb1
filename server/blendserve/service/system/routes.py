"""``GET /health`` and ``GET /v1/models``."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from blendserve.engines.base import Engine
from blendserve.service.errors import error_responses
from blendserve.service.state import service_of
from blendserve.service.system.schemas import HealthResponse, ModelCard, ModelListResponse

__all__ = ["router"]

router = APIRouter()


def _engine(request: Request) -> Engine:
    return service_of(request).engine


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
        cost=None if engine.cost is None else engine.cost.describe(),
        detail=state.detail,
    )
    return JSONResponse(body.model_dump(), status_code=200 if state.healthy else 503)


@router.get("/v1/models", response_model=ModelListResponse, responses=error_responses(401, 503))
async def list_models(request: Request) -> ModelListResponse:
    """The models the engine serves, in OpenAI's format."""
    names = await _engine(request).models()
    return ModelListResponse(data=[ModelCard(id=name) for name in names])
