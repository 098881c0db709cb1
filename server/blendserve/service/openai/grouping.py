"""Request grouping: concurrent self-consistency requests share one Blend-ASC job.

Requests whose job options agree are gathered (the paper's "batched queries")
into one job whose budget is the sum of theirs; each request is answered as
soon as its own questions are final, not when the group ends.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field

from blendserve.errors import EngineUnavailable, SchedulerError
from blendserve.scheduler import AnswerEvent, DoneEvent, Job, Question
from blendserve.service.jobs import JobMaker, JobOptions
from blendserve.service.shutdown import RunningJobs

__all__ = ["Grouper", "Ticket"]


@dataclass(eq=False)
class _Group:
    options: JobOptions
    questions: list[Question] = field(default_factory=list)
    budgets: list[float] = field(default_factory=list)
    futures: list[asyncio.Future[AnswerEvent]] = field(default_factory=list)
    job: Job | None = None
    task: asyncio.Task[None] | None = None
    timer: asyncio.TimerHandle | None = None
    # group index -> job index, once launched
    index: dict[int, int] = field(default_factory=dict)


class Ticket:
    """One request's questions in a group: await :meth:`answers`, or :meth:`abandon`."""

    def __init__(self, grouper: Grouper, group: _Group, indices: Sequence[int]) -> None:
        self._grouper = grouper
        self._group = group
        self.futures = [group.futures[i] for i in indices]
        self._indices = list(indices)

    async def answers(self) -> list[AnswerEvent]:
        """Every question's answer event, in the request's order."""
        return list(await asyncio.gather(*self.futures))

    def abandon(self) -> None:
        """The caller went away: its questions get no more samples."""
        self._grouper._abandon(self._group, self._indices)


class Grouper:
    """Gathers requests into jobs made by ``maker``: a group stays open ``wait`` seconds
    for more requests, or starts at once with ``max_questions``; ``jobs`` tracks the jobs
    for a shutdown (None: a set of its own).
    """

    def __init__(
        self,
        maker: JobMaker,
        *,
        wait: float,
        max_questions: int,
        jobs: RunningJobs | None = None,
    ) -> None:
        self.maker = maker
        self.wait = wait
        self.max_questions = max_questions
        self.jobs = jobs if jobs is not None else RunningJobs()
        self._open: dict[str, _Group] = {}
        self._running: set[asyncio.Task[None]] = set()
        #: Jobs started so far.
        self.jobs_started = 0
        self._ids = itertools.count()

    def submit(
        self, options: JobOptions, questions: Sequence[Question], budget_per_question: float
    ) -> Ticket:
        """Adds a request's questions to the open group of its options."""
        key = options.key()
        group = self._open.get(key)
        if group is None:
            group = self._open[key] = _Group(options)
            if self.wait > 0:
                loop = asyncio.get_running_loop()
                group.timer = loop.call_later(self.wait, self._launch, key, group)
        loop = asyncio.get_running_loop()
        start = len(group.questions)
        for question in questions:
            # Question ids must be unique in a job (replica affinity keys on them) and, as a
            # recording's ids, in the service: "g" sets them apart from the online pools'.
            unique = Question(
                f"g{next(self._ids)}:{question.id}", question.prompt, question.messages
            )
            group.questions.append(unique)
            group.budgets.append(budget_per_question)
            group.futures.append(loop.create_future())
        ticket = Ticket(self, group, range(start, len(group.questions)))
        if len(group.questions) >= self.max_questions or self.wait <= 0:
            self._launch(key, group)
        return ticket

    def _launch(self, key: str, group: _Group) -> None:
        if self._open.get(key) is group:
            del self._open[key]
        if group.timer is not None:
            group.timer.cancel()
        if group.task is not None:
            return
        live = [i for i, f in enumerate(group.futures) if not f.done()]
        if not live:
            return
        group.index = {i: j for j, i in enumerate(live)}
        options = group.options
        budget = max(len(live), round(sum(group.budgets[i] for i in live)))
        job = self.maker.job(options, [group.questions[i] for i in live], budget)
        group.job = self.jobs.add(job)
        self.jobs_started += 1
        group.task = asyncio.get_running_loop().create_task(self._run(group, live))
        self._running.add(group.task)
        group.task.add_done_callback(self._running.discard)

    async def _run(self, group: _Group, live: list[int]) -> None:
        assert group.job is not None
        futures = [group.futures[i] for i in live]
        error: BaseException = SchedulerError("the job ended without answering")
        try:
            async for event in group.job.events():
                if isinstance(event, AnswerEvent):
                    # A question the failed job never sampled gets the job's error.
                    if not futures[event.index].done() and not (
                        event.partial and not event.samples
                    ):
                        futures[event.index].set_result(event)
                elif isinstance(event, DoneEvent) and event.error:
                    error = event.cause or EngineUnavailable(event.error)
        except Exception as exc:  # a bug below: every waiting request learns of it
            error = exc
        finally:
            for future in futures:
                if not future.done():
                    future.set_exception(error)
                    future.exception()  # retrieved: an abandoned request never awaits it

    def _abandon(self, group: _Group, indices: Sequence[int]) -> None:
        for i in indices:
            future = group.futures[i]
            future.cancel()  # a no-op once answered
            if future.cancelled() and group.job is not None and i in group.index:
                group.job.abandon(group.index[i])
        if group.task is not None and all(f.done() for f in group.futures):
            group.task.cancel()  # nobody is waiting: stop every sample of the job

    async def aclose(self) -> None:
        """Cancels every running job."""
        for group in list(self._open.values()):
            if group.timer is not None:
                group.timer.cancel()
            for future in group.futures:
                future.cancel()
        self._open.clear()
        for task in list(self._running):
            task.cancel()
        await asyncio.gather(*self._running, return_exceptions=True)

    @property
    def running(self) -> int:
        """Jobs running now."""
        return len(self._running)
