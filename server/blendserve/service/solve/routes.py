"""``POST /solve``."""

from __future__ import annotations

import asyncio

from fastapi import APIRouter, Request
from fastapi.responses import Response

from blendserve.service.admission import admitted
from blendserve.service.errors import error_responses
from blendserve.service.limits import Budget, Passed, Prompt
from blendserve.service.solve.handlers import build_job, collect, ndjson_lines, sse_frames
from blendserve.service.solve.schemas import SolveRequest, SolveResponse
from blendserve.service.state import service_of

__all__ = ["router"]

router = APIRouter()

NDJSON, SSE = "application/x-ndjson", "text/event-stream"


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
    text/event-stream``, NDJSON with ``Accept: application/x-ndjson``; a
    type the header gives ``q=0`` is not asked for.
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
    extra = Passed(body.sampling.extra, "sampling.extra")
    async with admitted(request, prompts, _budget(body), param="questions", passed=extra) as held:
        built = await build_job(body, state.job_maker, state.clients.of(request.headers))
        job = state.running.add(built)
        streamed = _stream_type(request.headers.get("accept", ""), body.stream)
        thoughts = body.include_reasoning
        if streamed == NDJSON:
            return held.stream(
                ndjson_lines(job, held.slot, include_reasoning=thoughts),
                media_type="application/x-ndjson",
            )
        if streamed == SSE:
            return held.stream(
                sse_frames(job, held.slot, include_reasoning=thoughts),
                media_type="text/event-stream",
                headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
            )
        return await held.wait(collect(job, held.slot, include_reasoning=thoughts))


def _stream_type(accept: str, stream: bool) -> str | None:
    """The stream type a request asks for: ``Accept``'s, else SSE with ``stream``; None: JSON.

    Only a type the header names counts (not ``*/*``), and not with ``q=0``; of the
    two, the higher ``q`` wins, NDJSON on a tie.
    """
    weights: dict[str, float] = {}
    for part in accept.split(","):
        media_type, *params = (piece.strip() for piece in part.split(";"))
        media_type = media_type.lower()
        if media_type not in (NDJSON, SSE):
            continue
        weight = 1.0
        for param in params:
            name, _, value = param.partition("=")
            if name.strip().lower() == "q":
                try:
                    weight = float(value)
                except ValueError:
                    weight = 0.0  # not a weight: not asked for
        weights[media_type] = max(weights.get(media_type, 0.0), weight)
    asked = {media_type: weight for media_type, weight in weights.items() if weight > 0}
    if asked:
        return max((NDJSON, SSE), key=lambda media_type: asked.get(media_type, 0.0))
    return SSE if stream else None


def _budget(body: SolveRequest) -> Budget:
    """The request's budget, named by the field it comes from (a cap, with ``confidence``)."""
    total = body.total_budget
    if body.confidence is not None:
        return Budget(body.cap, total, "max_samples_per_question")
    if body.budget_per_question is not None:
        return Budget(body.budget_per_question, total, "budget_per_question")
    return Budget(total / max(1, len(body.questions)), total, "budget")
