"""The scheduler: one asyncio job per request, driving a core policy over an engine."""

from blendserve.scheduler.events import (
    AnswerEvent,
    Confidence,
    DoneEvent,
    Event,
    JobStatus,
    ProgressEvent,
    Usage,
)
from blendserve.scheduler.job import Job
from blendserve.scheduler.spec import JobSpec, Keyer, Question

__all__ = [
    "AnswerEvent",
    "Confidence",
    "DoneEvent",
    "Event",
    "Job",
    "JobSpec",
    "JobStatus",
    "Keyer",
    "ProgressEvent",
    "Question",
    "Usage",
]
