"""Schemas of ``/health`` and ``/v1/models``."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field

__all__ = ["HealthResponse", "ModelCard", "ModelListResponse"]


class HealthResponse(BaseModel):
    """Service health: ``ok`` when the engine can serve."""

    status: Literal["ok", "unavailable"]
    engine: str
    upstreams: dict[str, bool]
    capacity: int | None = Field(
        None,
        description="sequences the engine runs at once, as the service knows it (null: "
        "unknown, and jobs decide sample by sample)",
    )
    cost: dict[str, Any] | None = Field(
        None,
        description="what a decode step of the engine costs, as the service knows it: the "
        "profile (--engine-profile), observations of the engine's own (vLLM's metrics), "
        "their context, the fit in use and its step time in ms at a few widths (null: unknown)",
    )
    detail: str | None = Field(
        None,
        description="why the engine cannot serve, where it knows: what died, how, and "
        "what to do (null while it serves)",
    )


class ModelCard(BaseModel):
    """One model, as OpenAI's ``/v1/models`` lists it."""

    id: str
    object: Literal["model"] = "model"
    created: int = 0
    owned_by: str = "blendserve"


class ModelListResponse(BaseModel):
    """OpenAI's model list."""

    object: Literal["list"] = "list"
    data: list[ModelCard]
