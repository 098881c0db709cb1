"""Graceful shutdown: running jobs and pool questions get a grace period, then end with
the answers they have."""

from __future__ import annotations

import asyncio
import math
import socket
import weakref
from typing import Protocol, TypeVar

import uvicorn

from blendserve.scheduler import JobStatus
from blendserve.scheduler.pool import Pool

__all__ = ["Cancellable", "DrainingServer", "RunningJobs"]

#: Seconds a cancelled job's handler gets to send its partial answers.
_FLUSH_S = 5


class Cancellable(Protocol):
    """A job a shutdown may end early: it then answers with what it has."""

    status: JobStatus

    def cancel(self, reason: str) -> None:
        """Ends the job now; its caller gets partial answers (a no-op once it ended)."""


_J = TypeVar("_J", bound=Cancellable)


class RunningJobs:
    """The jobs and online pools this service started (held weakly: a finished job drops out)."""

    def __init__(self) -> None:
        self._jobs: weakref.WeakSet[Cancellable] = weakref.WeakSet()
        self._pools: weakref.WeakSet[Pool] = weakref.WeakSet()

    def add(self, job: _J) -> _J:
        """Tracks ``job`` until it is gone; returns it."""
        self._jobs.add(job)
        return job

    def add_pool(self, pool: Pool) -> Pool:
        """Tracks ``pool`` until it is gone; returns it."""
        self._pools.add(pool)
        return pool

    def cancel_all(self, reason: str) -> int:
        """Cancels every running job and ends every open pool question; returns how many."""
        running = [job for job in self._jobs if not job.status.finished]
        for job in running:
            job.cancel(reason)
        pools = list(self._pools)
        num_open = sum(pool.num_open for pool in pools)
        for pool in pools:
            pool.cancel(reason)
        return len(running) + num_open


class DrainingServer(uvicorn.Server):
    """uvicorn's server whose shutdown cancels the jobs still running after ``grace`` seconds.

    Jobs and pool questions still running then end with their partial answers
    (status ``cancelled``) instead of being cut; uvicorn's own cut comes a few
    seconds later, for requests that still do not end.
    """

    def __init__(self, config: uvicorn.Config, running: RunningJobs, grace: float) -> None:
        config.timeout_graceful_shutdown = math.ceil(grace) + _FLUSH_S
        super().__init__(config)
        self.running = running
        self.grace = grace

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        """Stops accepting, then cancels the jobs left when the grace runs out."""
        timer = asyncio.get_running_loop().call_later(
            self.grace, self.running.cancel_all, "the service is shutting down"
        )
        try:
            await super().shutdown(sockets)
        finally:
            timer.cancel()
