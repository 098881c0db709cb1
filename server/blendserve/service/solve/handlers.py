"""Runs ``/solve`` jobs and renders their events as JSON, SSE or NDJSON."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncGenerator, AsyncIterator
from contextlib import aclosing
from dataclasses import asdict

from blendserve.scheduler import (
    AnswerEvent,
    DoneEvent,
    Event,
    Job,
    JobStatus,
    ProgressEvent,
    Question,
)
from blendserve.scheduler.pool import SHARED_CLIENT
from blendserve.service.jobs import JobMaker, JobOptions
from blendserve.service.limits import Slot
from blendserve.service.solve.pooled import PooledJob
from blendserve.service.solve.schemas import (
    AnswerOut,
    BudgetOut,
    SolveRequest,
    SolveResponse,
    UsageOut,
)
from blendserve.service.vocabulary import vote_fields

__all__ = ["build_job", "collect", "ndjson_lines", "sse_frames"]

#: What a request runs: a budgeted job, or a batch with a quality target.
Runnable = Job | PooledJob

_STATUS = {
    JobStatus.COMPLETED: "completed",
    JobStatus.FAILED: "failed",
    JobStatus.CANCELLED: "cancelled",
}


#: Questions built between two yields to the event loop (a few milliseconds of work).
_CHUNK = 1000


async def build_job(
    request: SolveRequest, maker: JobMaker, client: str = SHARED_CLIENT
) -> Runnable:
    """The job for a validated request, made with the service's engine and defaults, its
    traces learned as ``client``'s.

    With ``confidence``: a pool of its own at the fixed price ``1 - confidence``. A
    large request is built a chunk of questions at a time, yielding to the event
    loop in between, so that large requests arriving together take turns with
    ``/health``.
    """
    questions: list[Question] = []
    for start in range(0, len(request.questions), _CHUNK):
        if start:
            await asyncio.sleep(0)
        questions += [
            Question(id=q.id if q.id is not None else str(i), prompt=q.prompt, messages=q.messages)
            for i, q in enumerate(request.questions[start : start + _CHUNK], start)
        ]
    options = JobOptions.asked(
        request,
        request.sampling.to_sampling_params(),
        request.model,
        concurrency=request.concurrency,
        in_flight_per_question=request.in_flight_per_question,
    )
    if request.confidence is not None:
        target = 1.0 - request.confidence
        pool = maker.pool(
            options, "solve", budget_per_question=None, target=target, max_cap=request.cap
        )
        return PooledJob(pool, questions, client)
    return maker.job(options, questions, request.total_budget, client)


def answer_out(event: AnswerEvent, include_reasoning: bool = False) -> AnswerOut:
    """The response form of an answer event (its completion's thought, if asked for)."""
    return AnswerOut(
        index=event.index,
        id=event.id,
        completion=event.completion,
        usage=UsageOut(**asdict(event.usage)),
        reasoning=event.reasoning if include_reasoning else None,
        **vote_fields(event),
    )


def _summary(done: DoneEvent, answers: list[AnswerOut]) -> SolveResponse:
    return SolveResponse(
        status=_STATUS.get(done.status, "cancelled"),
        answers=sorted(answers, key=lambda a: a.index),
        usage=UsageOut(**asdict(done.usage)),
        budget=BudgetOut(total=done.budget, spent=done.spent, unspent=done.unspent),
        duration_s=round(done.duration_s, 6),
        error=done.error,
    )


async def _events(job: Runnable, slot: Slot | None) -> AsyncGenerator[Event, None]:
    """The job's events; each answer gives its question's admission slot back.

    The event loop has a turn after each answer: a job's last answers come out in
    a burst that would otherwise hold it (and ``/health``), and a lost connection
    is seen before the next answer is written to it.
    """
    async with aclosing(job.events()) as events:
        async for event in events:
            if isinstance(event, AnswerEvent):
                if slot is not None:
                    slot.answered()
                yield event
                await asyncio.sleep(0)
            else:
                yield event


async def collect(
    job: Runnable, slot: Slot | None = None, *, include_reasoning: bool = False
) -> SolveResponse:
    """Runs the job to the end and returns every answer in question order.

    ``slot`` (its admission) is given back question by question as they are
    answered; with ``include_reasoning`` each answer carries its completion's thought.
    """
    answers: list[AnswerOut] = []
    async with aclosing(_events(job, slot)) as events:
        async for event in events:
            if isinstance(event, AnswerEvent):
                answers.append(answer_out(event, include_reasoning))
            elif isinstance(event, DoneEvent):
                return _summary(event, answers)
    raise AssertionError("a job always ends with a done event")


def _payload(event: Event, include_reasoning: bool) -> tuple[str, dict[str, object]]:
    if isinstance(event, AnswerEvent):
        return "answer", answer_out(event, include_reasoning).model_dump()
    if isinstance(event, ProgressEvent):
        return "progress", asdict(event)
    return "done", _summary(event, []).model_dump(exclude={"answers"})


async def sse_frames(
    job: Runnable, slot: Slot | None = None, *, include_reasoning: bool = False
) -> AsyncIterator[str]:
    """Server-sent events: ``answer``, ``progress``, then ``done`` (arguments as for collect)."""
    # Closed with the response, however it ends: the job's requests go with it.
    async with aclosing(_events(job, slot)) as events:
        async for event in events:
            name, data = _payload(event, include_reasoning)
            yield f"event: {name}\ndata: {json.dumps(data)}\n\n"


async def ndjson_lines(
    job: Runnable, slot: Slot | None = None, *, include_reasoning: bool = False
) -> AsyncIterator[str]:
    """One JSON object a line: ``{"event": ..., "data": ...}`` (arguments as for collect)."""
    async with aclosing(_events(job, slot)) as events:
        async for event in events:
            name, data = _payload(event, include_reasoning)
            yield json.dumps({"event": name, "data": data}) + "\n"
