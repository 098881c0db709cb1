"""``POST /solve``."""

from __future__ import annotations

import asyncio

from fastapi import APIRouter, Request
from fastapi.responses import Response

from blendserve.service.disconnect import ClientGone, while_connected
from blendserve.service.errors import error_responses
from blendserve.service.limits import HeldStreamingResponse, Prompt
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
        },
        **error_responses(400, 401, 413, 422, 429),
    },
)
async def solve(body: SolveRequest, request: Request) -> SolveResponse | Response:
    """Answers every question by adaptive self-consistency within one budget.

    With ``confidence`` instead of a budget, each question stops at that
    quality target (or its cap), in a pool of the request's own.

    Streams server-sent events (``answer`` per question as it settles,
    ``progress``, ``done``) with ``stream: true`` or ``Accept:
    text/event-stream``, NDJSON with ``Accept: application/x-ndjson``.
    """
    state = request.app.state
    # Validation of a large body has just run on the event loop: let others have a turn.
    await asyncio.sleep(0)
    prompts: dict[str, Prompt] = {}
    for i, q in enumerate(body.questions):
        if q.prompt is not None:
            prompts[f"questions.{i}.prompt"] = q.prompt
        elif q.messages is not None:
            prompts[f"questions.{i}.messages"] = q.messages
    state.limits.check(
        prompts,
        body.total_budget,
        questions_param="questions",
        budget_param=_budget_param(body),
    )
    job = state.running.add(await build_job(body, state.engine, state.settings))
    slot = state.admission.admit(len(body.questions))
    accept = request.headers.get("accept", "")
    if "application/x-ndjson" in accept:
        return HeldStreamingResponse(
            ndjson_lines(job, slot), slot, media_type="application/x-ndjson"
        )
    if body.stream or "text/event-stream" in accept:
        return HeldStreamingResponse(
            sse_frames(job, slot),
            slot,
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )
    try:
        return await while_connected(request, collect(job, slot))
    except ClientGone:
        return Response(status_code=499)
    finally:
        slot.release()


def _budget_param(body: SolveRequest) -> str:
    """The field a request's total budget comes from (a cap, with ``confidence``)."""
    if body.confidence is not None:
        return "max_samples_per_question"
    return "budget" if body.budget is not None else "budget_per_question"
