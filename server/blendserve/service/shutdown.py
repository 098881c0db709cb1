"""Graceful shutdown: running jobs and pool questions get a grace period, then end with
the answers they have."""

from __future__ import annotations

import asyncio
import math
import socket
import weakref
from typing import Protocol, TypeVar

import uvicorn

__all__ = ["Cancellable", "DrainingServer", "RunningJobs"]

#: Seconds a cancelled job's handler gets to send its partial answers.
_FLUSH_S = 5


class Cancellable(Protocol):
    """Work that a shutdown may end early: it then answers with what it has."""

    def cancel(self, reason: str) -> None:
        """Ends the work now; its callers get partial answers (a no-op once it ended)."""


_C = TypeVar("_C", bound=Cancellable)


class RunningJobs:
    """The jobs and online pools this service started (held weakly: a finished job drops out)."""

    def __init__(self) -> None:
        self._jobs: weakref.WeakSet[Cancellable] = weakref.WeakSet()

    def add(self, job: _C) -> _C:
        """Tracks ``job`` (a :class:`~blendserve.scheduler.Job` or a pool) until it is gone."""
        self._jobs.add(job)
        return job

    def cancel_all(self, reason: str) -> None:
        """Cancels every job and ends every open pool question (see their ``cancel``)."""
        for job in list(self._jobs):
            job.cancel(reason)


class DrainingServer(uvicorn.Server):
    """uvicorn's server whose shutdown cancels the jobs still running after ``grace`` seconds.

    On SIGTERM uvicorn stops accepting and waits for open requests; jobs
    and pool questions still running after the grace are cancelled, so each request ends
    normally with its partial answers (status ``cancelled``) instead of
    being cut. uvicorn's own cut comes a few seconds later, for requests
    that still do not end.
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
