"""One error contract: every error body carries OpenAI's ``type`` for its status."""

from __future__ import annotations

from blendserve.errors import EngineTimeout, InvalidRequest, ModelNotFound, ServiceOverloaded
from blendserve.service import Settings, create_app
from blendserve.service.errors import error_body, status_for


def test_the_schema_declares_openais_types_only() -> None:
    schema = create_app(Settings()).openapi()
    detail = schema["components"]["schemas"]["ErrorDetail"]["properties"]["type"]
    assert set(detail["enum"]) == {"invalid_request_error", "rate_limit_error", "server_error"}


def test_each_domain_error_has_its_status_and_type() -> None:
    cases = [
        (InvalidRequest("bad", param="budget"), 422, "invalid_request_error"),
        (ModelNotFound("m", ["served"]), 404, "invalid_request_error"),
        (ServiceOverloaded("busy"), 429, "rate_limit_error"),
        (EngineTimeout("slow"), 504, "server_error"),
    ]
    for exc, status, type_ in cases:
        assert status_for(exc) == status
        body = error_body(str(exc), status, param=getattr(exc, "param", None))
        assert body["error"]["type"] == type_  # type: ignore[index]
