"""``GET /metrics`` and the middleware that counts HTTP requests by route and status."""

from __future__ import annotations

import asyncio
import threading
import time

from fastapi import APIRouter
from fastapi.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from blendserve.service import metrics

__all__ = ["RequestMetrics", "router"]

router = APIRouter()
#: One render at a time: concurrent scrapes take turns in their worker threads.
_RENDERING = threading.Lock()


def _render() -> bytes:
    with _RENDERING:
        return metrics.exposition()


@router.get("/metrics", include_in_schema=False)
async def prometheus_metrics() -> Response:
    """Every metric in Prometheus's text format, rendered off the event loop."""
    body = await asyncio.to_thread(_render)
    return Response(body, media_type=metrics.CONTENT_TYPE_LATEST)


class RequestMetrics:
    """Counts requests by route template (never the raw path) and status, and times them.

    A request no route matched (any path a client makes up) counts as ``unmatched``.
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        status = 500
        started = time.monotonic()

        async def send_status(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_status)
        finally:
            route = scope.get("route")
            endpoint = getattr(route, "path", None) or "unmatched"
            metrics.REQUESTS.labels(endpoint, str(status)).inc()
            metrics.REQUEST_DURATION.labels(endpoint).observe(time.monotonic() - started)
