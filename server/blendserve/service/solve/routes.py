"""``POST /solve``."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import Response, StreamingResponse

from blendserve.service.disconnect import ClientGone, while_connected
from blendserve.service.limits import release_after
from blendserve.service.solve.handlers import build_job, collect, ndjson_lines, sse_frames
from blendserve.service.solve.schemas import SolveRequest, SolveResponse

__all__ = ["router"]

router = APIRouter()


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
    state = request.app.state
    state.limits.check(
        [q.prompt if q.prompt is not None else q.messages for q in body.questions],
        body.total_budget,
        prefix="questions",
    )
    settings = state.settings
    job = build_job(body, state.engine, settings.default_concurrency, settings.upstream_timeout)
    slot = state.admission.admit(len(body.questions))
    accept = request.headers.get("accept", "")
    if "application/x-ndjson" in accept:
        lines = release_after(ndjson_lines(job), slot)
        return StreamingResponse(lines, media_type="application/x-ndjson")
    if body.stream or "text/event-stream" in accept:
        return StreamingResponse(
            release_after(sse_frames(job), slot),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )
    try:
        return await while_connected(request, collect(job))
    except ClientGone:
        return Response(status_code=499)
    finally:
        slot.release()
