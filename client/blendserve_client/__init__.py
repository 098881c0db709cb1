"""Python SDK for a blendserve service: ``Client`` and ``AsyncClient``."""

from blendserve_client.client import AsyncClient, Client, StreamEvent
from blendserve_client.errors import APIError
from blendserve_client.models import Answer, Budget, Confidence, Progress, SolveResult, Usage
from blendserve_client.options import AnswerFormat, AnswerKind, Sampling, SolveFields, SolveOptions

__all__ = [
    "APIError",
    "Answer",
    "AnswerFormat",
    "AnswerKind",
    "AsyncClient",
    "Budget",
    "Client",
    "Confidence",
    "Progress",
    "Sampling",
    "SolveFields",
    "SolveOptions",
    "SolveResult",
    "StreamEvent",
    "Usage",
]
