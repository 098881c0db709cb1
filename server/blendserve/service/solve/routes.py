"""``POST /solve``."""

from __future__ import annotations

import asyncio

from fastapi import APIRouter, Request
from fastapi.responses import Response, StreamingResponse

from blendserve.scheduler import Job
from blendserve.service.solve.handlers import build_job, collect, ndjson_lines, sse_frames
from blendserve.service.solve.schemas import SolveRequest, SolveResponse

__all__ = ["router"]

router = APIRouter()
_DISCONNECT_POLL_S = 0.2  # a gone client's samples stop within this


@router.post(
    "/solve",
    response_model=SolveResponse,
    responses={
        200: {
            "content": {"text/event-stream": {}, "application/x-ndjson": {}},
            "description": "JSON, or events when streamed",
        }
    },
)
async def solve(body: SolveRequest, request: Request) -> SolveResponse | Response:
    """Answers every question by adaptive self-consistency within one budget.

    Streams server-sent events (``answer`` per question as it settles,
    ``progress``, ``done``) with ``stream: true`` or ``Accept:
    text/event-stream``, NDJSON with ``Accept: application/x-ndjson``.
    """
    settings = request.app.state.settings
    job = build_job(body, request.app.state.engine, settings.default_concurrency)
    accept = request.headers.get("accept", "")
    if "application/x-ndjson" in accept:
        return StreamingResponse(ndjson_lines(job), media_type="application/x-ndjson")
    if body.stream or "text/event-stream" in accept:
        return StreamingResponse(
            sse_frames(job),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )
    return await _collect_while_connected(job, request)


async def _collect_while_connected(job: Job, request: Request) -> SolveResponse | Response:
    """Runs the job to the end; a client that went away cancels it (and its samples)."""
    task = asyncio.ensure_future(collect(job))
    try:
        while True:
            done, _ = await asyncio.wait({task}, timeout=_DISCONNECT_POLL_S)
            if done:
                return task.result()
            if await request.is_disconnected():
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
                return Response(status_code=499)
    finally:
        task.cancel()
