"""``POST /solve``."""

from __future__ import annotations

import asyncio

from fastapi import APIRouter, Request
from fastapi.responses import Response

from blendserve.service.admission import admitted
from blendserve.service.errors import error_responses
from blendserve.service.limits import Budget, Prompt
from blendserve.service.solve.handlers import build_job, collect, ndjson_lines, sse_frames
from blendserve.service.solve.schemas import SolveRequest, SolveResponse
from blendserve.service.state import service_of

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
        **error_responses(400, 401, 413, 422, 429, 503),
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
    state = service_of(request)
    # Validation of a large body has just run on the event loop: let others have a turn.
    await asyncio.sleep(0)
    prompts: dict[str, Prompt] = {}
    for i, q in enumerate(body.questions):
        if q.prompt is not None:
            prompts[f"questions.{i}.prompt"] = q.prompt
        elif q.messages is not None:
            prompts[f"questions.{i}.messages"] = q.messages
    async with admitted(request, prompts, _budget(body), param="questions") as held:
        built = await build_job(body, state.job_maker)
        job = state.running.add(built)
        accept = request.headers.get("accept", "")
        thoughts = body.include_reasoning
        if "application/x-ndjson" in accept:
            return held.stream(
                ndjson_lines(job, held.slot, include_reasoning=thoughts),
                media_type="application/x-ndjson",
            )
        if body.stream or "text/event-stream" in accept:
            return held.stream(
                sse_frames(job, held.slot, include_reasoning=thoughts),
                media_type="text/event-stream",
                headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
            )
        return await held.wait(collect(job, held.slot, include_reasoning=thoughts))


def _budget(body: SolveRequest) -> Budget:
    """The request's budget, named by the field it comes from (a cap, with ``confidence``)."""
    total = body.total_budget
    if body.confidence is not None:
        return Budget(body.cap, total, "max_samples_per_question")
    if body.budget_per_question is not None:
        return Budget(body.budget_per_question, total, "budget_per_question")
    return Budget(total / max(1, len(body.questions)), total, "budget")
