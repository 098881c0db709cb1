"""``/solve`` with a quality target: the batch's questions in a pool at a fixed price.

Each question stops once ASC's ``P[p1 < p2]`` is at most ``1 - confidence``
(or at its cap), whatever the others spend; answers come out as they settle,
with the events and summary of a job, so one renderer serves both.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Sequence
from dataclasses import replace

from blendserve.errors import EngineError
from blendserve.scheduler import (
    AnswerEvent,
    Confidence,
    DoneEvent,
    Event,
    JobStatus,
    Question,
    Usage,
)
from blendserve.scheduler.pool import SHARED_CLIENT, Pool

__all__ = ["PooledJob"]


class PooledJob:
    """Runs a batch through its own ``pool`` of a fixed target; iterate :meth:`events` as a job's.

    Its budget is the most the batch could spend, so ``unspent`` is what stopping
    at the target saved; a question whose engine keeps failing before its first
    sample gets an empty partial answer and fails the batch.
    """

    def __init__(
        self, pool: Pool, questions: Sequence[Question], client: str = SHARED_CLIENT
    ) -> None:
        if not questions:
            raise ValueError("a job needs at least one question")
        self.pool = pool
        self.client = client
        self.questions = list(questions)
        self.status = JobStatus.PENDING
        self._cancelled: str | None = None

    @property
    def budget(self) -> int:
        """The cap times the questions: the most the batch may spend."""
        return self.pool.rule().max_num_samples * len(self.questions)

    def cancel(self, reason: str) -> None:
        """Ends the batch now: every open question answers with what it has (partial)."""
        if self.status.finished or self._cancelled is not None:
            return
        self._cancelled = reason
        self.pool.cancel(reason)

    async def events(self) -> AsyncGenerator[Event, None]:
        """Answers as they settle, then the summary (closing early cancels the rest)."""
        self.status = JobStatus.RUNNING
        loop = asyncio.get_running_loop()
        started = loop.time()
        tasks = {self.pool.submit(q, self.client): i for i, q in enumerate(self.questions)}
        pending = set(tasks)
        usage = Usage()
        spent = settled = 0
        error: str | None = None
        cause: BaseException | None = None
        try:
            while pending:
                done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                for task in done:
                    i = tasks[task]
                    exc = task.exception()
                    if exc is None:
                        event = replace(task.result(), index=i)
                    elif isinstance(exc, EngineError):
                        error, cause = error or str(exc), cause or exc
                        event = _unanswered(i, self.questions[i].id)
                    else:
                        raise exc
                    usage.add(event.usage)
                    spent += event.samples
                    settled += event.settled_early
                    yield event
            if self._cancelled is not None:
                self.status, error = JobStatus.CANCELLED, error or self._cancelled
            else:
                self.status = JobStatus.FAILED if error is not None else JobStatus.COMPLETED
            yield DoneEvent(
                status=self.status,
                budget=self.budget,
                spent=spent,
                usage=usage,
                duration_s=loop.time() - started,
                error=error,
                cause=cause,
                answered=len(self.questions),
                settled=settled,
            )
        finally:
            if not self.status.finished:
                self.status = JobStatus.CANCELLED
            for task in pending:
                task.cancel()
            if pending:
                await asyncio.gather(*pending, return_exceptions=True)


def _unanswered(index: int, id: str) -> AnswerEvent:
    """A question with no sample: no answer, and a coin flip's confidence."""
    return AnswerEvent(
        index=index,
        id=id,
        answer=None,
        key=None,
        votes={},
        samples=0,
        confidence=Confidence(asc=0.5, ppr=1.0, share=0.0),
        settled_early=False,
        completion=None,
        usage=Usage(),
        partial=True,
    )
