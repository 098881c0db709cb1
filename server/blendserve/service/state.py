"""What the routes of one app read: built from its settings when the app starts."""

from __future__ import annotations

from dataclasses import dataclass

from fastapi import Request

from blendserve.engines.base import Engine
from blendserve.service.jobs import JobMaker
from blendserve.service.limits import Admission, JobLimits
from blendserve.service.openai.online import DropIn
from blendserve.service.openai.served import ServedModels
from blendserve.service.security import ClientIds
from blendserve.service.settings import Settings
from blendserve.service.shutdown import RunningJobs

__all__ = ["ServiceState", "service_of"]


@dataclass(frozen=True)
class ServiceState:
    """The one object an app keeps in ``app.state.service`` (made in its lifespan).

    Attributes:
        settings: the service's settings.
        engine: where samples come from.
        served_models: the model names ``/v1`` serves, and their aliases.
        job_maker: makes every job and pool (engine, defaults, answer keys).
        limits: what one request may ask.
        admission: how much may run at once.
        dropin: ``/v1``'s online pools and grouping window.
        running: the jobs running now, drained at shutdown.
        clients: who a request comes from (its pacing and sympy turns in a pool).
    """

    settings: Settings
    engine: Engine
    served_models: ServedModels
    job_maker: JobMaker
    limits: JobLimits
    admission: Admission
    dropin: DropIn
    running: RunningJobs
    clients: ClientIds


def service_of(request: Request) -> ServiceState:
    """The state of the app ``request`` came to."""
    state: ServiceState = request.app.state.service
    return state
