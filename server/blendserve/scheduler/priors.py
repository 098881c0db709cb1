"""What a pool's waves are planned with, built off the event loop.

A client's fitted prior (:class:`~blendserve.core.programme.VotePrior`) plans waves
with a dynamic programme and tables per price that are slow to build: on the event
loop they would stall every request of the service. :class:`Builds` runs them in a
worker thread, one at a time in the process, each once however many ask for it;
:func:`ready_rule` never waits for a programme (the one the prior had before its last
refit decides meanwhile, else that of a prior that has seen nothing), only for the
tables of a built programme at a new price.
"""

from __future__ import annotations

import asyncio
import threading
import weakref
from collections.abc import Callable, Hashable
from dataclasses import replace
from typing import Any, ClassVar, TypeVar

from blendserve.core.programme import VotePrior
from blendserve.core.stopping import StoppingRule

__all__ = ["Builds", "ready_rule"]

T = TypeVar("T")

# Builds of every event loop of the process (tests run several), one at a time.
_BUILDING = threading.Lock()


def _locked(build: Callable[[], T]) -> T:
    with _BUILDING:
        return build()


class Builds:
    """Runs builds in a worker thread, one at a time: awaited ones first, then those asked
    for in the background; a build asked for again while queued or running is the same one.

    One per event loop (:meth:`here`): its futures belong to that loop.
    """

    _of_loop: ClassVar[weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Builds]] = (
        weakref.WeakKeyDictionary()
    )

    def __init__(self) -> None:
        self._now: dict[Hashable, tuple[Callable[[], Any], asyncio.Future[Any]]] = {}
        self._later: dict[Hashable, tuple[Callable[[], Any], asyncio.Future[Any]]] = {}
        self._running: dict[Hashable, asyncio.Future[Any]] = {}
        self._worker: asyncio.Task[None] | None = None
        self.num_built = 0

    @classmethod
    def here(cls) -> Builds:
        """The builds of the running event loop."""
        loop = asyncio.get_running_loop()
        builds = cls._of_loop.get(loop)
        if builds is None:
            builds = cls._of_loop[loop] = cls()
        return builds

    def _queued(self, key: Hashable) -> asyncio.Future[Any] | None:
        for jobs in (self._now, self._later):
            if key in jobs:
                return jobs[key][1]
        return self._running.get(key)

    def ask(
        self, key: Hashable, build: Callable[[], Any], *, now: bool = True
    ) -> asyncio.Future[Any]:
        """Queues ``build()`` for the worker thread unless a build of ``key`` is queued or
        running; the future of that build's result. ``now``: it is awaited, and goes
        before the background builds (``now=False``)."""
        future = self._queued(key)
        if future is None:
            future = asyncio.get_running_loop().create_future()
            (self._now if now else self._later)[key] = (build, future)
        elif now and key in self._later:
            self._now[key] = self._later.pop(key)
        self._start()
        return future

    async def run(self, key: Hashable, build: Callable[[], T]) -> T:
        """``build()``'s result, built in the worker thread (once for equal ``key``\\ s)."""
        result: T = await asyncio.shield(self.ask(key, build))
        return result

    def later(self, key: Hashable, build: Callable[[], object]) -> None:
        """Has ``build()`` run in the worker thread once nothing awaited is queued."""
        self.ask(key, build, now=False)

    def _start(self) -> None:
        if self._worker is None or self._worker.done():
            self._worker = asyncio.get_running_loop().create_task(self._work())

    async def _work(self) -> None:
        while self._now or self._later:
            jobs = self._now or self._later
            key = next(iter(jobs))
            build, future = jobs.pop(key)
            self._running[key] = future
            try:
                result = await asyncio.to_thread(_locked, build)
            except Exception as exc:  # handed to whoever awaits it
                if not future.done():
                    future.set_exception(exc)
                    future.exception()  # a background build's failure is retried when asked again
            else:
                self.num_built += 1
                if not future.done():
                    future.set_result(result)
            finally:
                del self._running[key]


async def ready_rule(rule: StoppingRule, log_price: float, rounds: int) -> StoppingRule:
    """``rule`` deciding at ``log_price`` after ``rounds`` waves without building anything.

    The client's own programme decides where it is built (as ``rule`` would); a
    missing one is built in the background, its missing tables at a new price awaited.
    """
    prior = rule.prior
    if not isinstance(prior, VotePrior):
        return rule
    builds = Builds.here()
    rounds_left = max(1, rule.max_rounds - rounds)
    while True:
        ready = prior.ready(log_price, rounds_left)
        if ready is not None:
            return replace(rule, prior=ready)
        own = prior.need(log_price, rounds_left)
        if prior.programme_built:  # its tables at this price: quick to build
            await builds.run(own, own.build)
            continue
        builds.later(own, own.build)
        ready = prior.fallback(log_price, rounds_left)
        if ready is not None:
            return replace(rule, prior=ready)
        fresh = prior.fallback_need(log_price, rounds_left)
        await builds.run(fresh, fresh.build)
