"""Python SDK for a blendserve service: ``Client`` and ``AsyncClient``."""

from blendserve_client.client import AsyncClient, Client, StreamEvent
from blendserve_client.errors import APIError
from blendserve_client.models import Answer, Budget, Confidence, Progress, SolveResult, Usage

__all__ = [
    "APIError",
    "Answer",
    "AsyncClient",
    "Budget",
    "Client",
    "Confidence",
    "Progress",
    "SolveResult",
    "StreamEvent",
    "Usage",
]
