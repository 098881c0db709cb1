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

    ``dropin`` holds ``/v1``'s online pools and grouping window, ``running`` the
    jobs drained at shutdown, and ``clients`` says who a request comes from.
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
