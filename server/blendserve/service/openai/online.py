"""The drop-in's default: each question joins an always-open pool and stops once confident.

One pool per (model, answer format, sampling parameters, budget or quality
target), each client's price in it paced to the budget; requests join at
once, with no grouping wait. A pool with no open question, unused for its
idle time, is dropped.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import time
from collections.abc import Callable, Collection, Sequence

from blendserve.core.stopping import DEFAULT_CAP, Score
from blendserve.errors import ServiceOverloaded
from blendserve.scheduler import AnswerEvent, Question
from blendserve.scheduler.pool import SHARED_CLIENT, Pool
from blendserve.service.jobs import JobMaker, JobOptions
from blendserve.service.openai.grouping import Grouper, Ticket
from blendserve.service.openai.pool_labels import PoolLabels
from blendserve.service.shutdown import RunningJobs

__all__ = ["DropIn", "OnlinePools", "OnlineTicket"]


class OnlineTicket:
    """One request's questions in their pool: await :meth:`answers`, or :meth:`abandon`."""

    def __init__(self, tasks: Sequence[asyncio.Task[AnswerEvent]]) -> None:
        self.tasks = list(tasks)

    @property
    def futures(self) -> list[asyncio.Task[AnswerEvent]]:
        """Each question's answer, in the request's order (as :attr:`Ticket.futures`)."""
        return self.tasks

    async def answers(self) -> list[AnswerEvent]:
        """Every question's answer event, in the request's order."""
        return list(await asyncio.gather(*self.tasks))

    def abandon(self) -> None:
        """The caller went away: its questions get no more samples."""
        for task in self.tasks:
            task.cancel()


class OnlinePools:
    """The pools of one service, made on first use.

    Args:
        maker: makes each pool.
        score: the uncertainty thresholded (``asc`` or ``ppr``).
        cap: a question's cap, a multiple of the budget.
        max_pools: idle pools beyond this many are dropped (their pacing restarts).
        running: where the pools are tracked for a shutdown (None: a set of its own).
        models: the model names the operator configured, which a pool's label may name.
    """

    def __init__(
        self,
        maker: JobMaker,
        *,
        score: Score = "asc",
        cap: float = DEFAULT_CAP,
        max_pools: int = 64,
        running: RunningJobs | None = None,
        models: Callable[[], Collection[str]] = tuple,
    ) -> None:
        self.maker = maker
        self.score = score
        self.cap = cap
        self.max_pools = max_pools
        self.running = running if running is not None else RunningJobs()
        self.pools: dict[str, Pool] = {}
        self.labels = PoolLabels(models)
        self._ids = itertools.count()

    def pool(
        self, options: JobOptions, budget_per_question: float, confidence: float | None = None
    ) -> Pool:
        """The pool of these options and budget (or quality target), made if new."""
        target = None if confidence is None else 1.0 - confidence
        key = json.dumps([options.key(), budget_per_question, target])
        self._drop_idle(key)
        pool = self.pools.get(key)
        if pool is None:
            self._evict()
            label = self.labels.label(
                options.model, options.answer_kind, budget_per_question, target
            )
            pool = self.maker.pool(
                options,
                label,
                budget_per_question=None if target is not None else budget_per_question,
                target=target,
                score=self.score,
                cap=self.cap,
            )
            self.labels.hold(label)
            self.pools[key] = self.running.add_pool(pool)
        return pool

    def submit(
        self,
        options: JobOptions,
        questions: Sequence[Question],
        budget_per_question: float,
        confidence: float | None = None,
        client: str = SHARED_CLIENT,
    ) -> OnlineTicket:
        """Adds a request's questions to their pool at once, as ``client``'s."""
        pool = self.pool(options, budget_per_question, confidence)
        tasks = []
        for question in questions:
            # Ids must be unique among open questions (replica affinity keys on them).
            unique = Question(
                f"{next(self._ids)}:{question.id}", question.prompt, question.messages
            )
            tasks.append(pool.submit(unique, client))
        return OnlineTicket(tasks)

    def _drop(self, key: str) -> None:
        pool = self.pools.pop(key)
        if self.labels.release(pool.name):
            pool.sink.pool_dropped(pool.name)

    def _drop_idle(self, keep: str) -> None:
        """Drops the pools (other than ``keep``'s) idle for their idle time."""
        now = time.monotonic()
        for key in [k for k, pool in self.pools.items() if k != keep and pool.idle(now)]:
            self._drop(key)

    def _evict(self) -> None:
        if len(self.pools) < self.max_pools:
            return
        for key, pool in list(self.pools.items()):
            if pool.num_open == 0:
                self._drop(key)
                if len(self.pools) < self.max_pools:
                    return
        raise ServiceOverloaded(
            f"{self.max_pools} self-consistency pools are busy: at most that many"
        )

    async def aclose(self) -> None:
        """Cancels every open question."""
        await asyncio.gather(*(pool.aclose() for pool in self.pools.values()))


class DropIn:
    """Where ``/v1`` self-consistency goes: the online pools or grouped Blend-ASC jobs.

    Online is the default; a request naming a ``policy`` (a batch policy)
    and the ``grouped`` mode use the grouping window as before.
    """

    def __init__(self, pools: OnlinePools, grouper: Grouper, *, online: bool = True) -> None:
        self.pools = pools
        self.grouper = grouper
        self.online = online

    def submit(
        self,
        options: JobOptions,
        questions: Sequence[Question],
        budget_per_question: float,
        *,
        confidence: float | None = None,
        policy_asked: bool = False,
        client: str = SHARED_CLIENT,
    ) -> OnlineTicket | Ticket:
        """Sends a request's questions to a pool (as ``client``'s), or to a group when asked to."""
        if confidence is not None or (self.online and not policy_asked):
            return self.pools.submit(options, questions, budget_per_question, confidence, client)
        return self.grouper.submit(options, questions, budget_per_question)

    async def aclose(self) -> None:
        """Cancels every open question and running job."""
        await asyncio.gather(self.pools.aclose(), self.grouper.aclose())
