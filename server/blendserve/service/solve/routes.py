"""``POST /solve``."""

from __future__ import annotations

import asyncio

from fastapi import APIRouter, Request
from fastapi.responses import Response

from blendserve.service.admission import admitted
from blendserve.service.errors import error_responses
from blendserve.service.limits import Prompt
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
    async with admitted(
        request,
        len(body.questions),
        param="questions",
        prompts=prompts,
        budget=body.total_budget,
        budget_param=_budget_param(body),
    ) as held:
        built = await build_job(body, state.job_maker)
        job = state.running.add(built)
        accept = request.headers.get("accept", "")
        if "application/x-ndjson" in accept:
            return held.stream(ndjson_lines(job, held.slot), media_type="application/x-ndjson")
        if body.stream or "text/event-stream" in accept:
            return held.stream(
                sse_frames(job, held.slot),
                media_type="text/event-stream",
                headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
            )
        return await held.wait(collect(job, held.slot))


def _budget_param(body: SolveRequest) -> str:
    """The field a request's total budget comes from (a cap, with ``confidence``)."""
    if body.confidence is not None:
        return "max_samples_per_question"
    return "budget" if body.budget is not None else "budget_per_question"
