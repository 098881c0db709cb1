"""How an OpenAI-compatible engine talks to its upstreams, in small frozen objects (as httpx's).

:class:`Timeouts` (how long it waits), :class:`Limits` (how much it holds),
:class:`Health` (when a replica is taken out and tried again) and
:class:`~blendserve.engines._retry.RetryPolicy` (how often it retries).
"""

from __future__ import annotations

from dataclasses import dataclass

from blendserve.engines._retry import RetryPolicy

__all__ = ["Health", "Limits", "RetryPolicy", "Timeouts"]


@dataclass(frozen=True)
class Timeouts:
    """How long an engine waits, in seconds.

    Attributes:
        call: a ``generate`` call's default deadline, retries included.
        connect: a TCP connect of one attempt.
        stall: with streamed responses, an attempt whose upstream sends nothing
            for this long fails (a hung upstream) and is retried elsewhere;
            None: only the call's deadline bounds it.
    """

    call: float = 600.0
    connect: float = 10.0
    stall: float | None = None

    def __post_init__(self) -> None:
        if not (self.call > 0 and self.connect > 0):
            raise ValueError(f"timeouts must be positive, got {self}")
        if self.stall is not None and not self.stall > 0:
            raise ValueError(f"the stall timeout must be positive, got {self.stall}")


@dataclass(frozen=True)
class Limits:
    """How much an engine holds.

    Attributes:
        connections: keep-alive connections per replica.
        response_bytes: the largest upstream response body read.
    """

    connections: int = 256
    response_bytes: int = 64 << 20

    def __post_init__(self) -> None:
        if self.connections < 1 or self.response_bytes < 1:
            raise ValueError(f"limits must be at least 1, got {self}")


@dataclass(frozen=True)
class Health:
    """When a replica is taken out of rotation, probed, or passed over.

    Its breaker opens after ``failure_threshold`` failures in a row and it is
    probed every ``probe_interval`` seconds while out; a question's home replica
    is passed over once it carries more than ``affinity_slack`` sequences (or a
    quarter of the least-loaded one's) over the least-loaded replica.
    """

    failure_threshold: int = 3
    probe_interval: float = 2.0
    affinity_slack: int = 4

    def __post_init__(self) -> None:
        if not self.probe_interval > 0:
            raise ValueError(f"probe_interval must be positive, got {self.probe_interval}")
