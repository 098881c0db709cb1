"""When an engine request that failed is tried again, and what it raises when it is not."""

from __future__ import annotations

import random
from dataclasses import dataclass

import httpx2

from blendserve.errors import EngineProtocolError, EngineTimeout, EngineUnavailable

__all__ = ["RetryPolicy", "Throttles", "exhausted"]


@dataclass(frozen=True)
class RetryPolicy:
    """Retries of one logical request: how many, and how long to wait before each.

    Attributes:
        max_retries: retries after the first attempt.
        backoff_base: first backoff in seconds, doubled per retry (capped at
            ``max_backoff``) with jitter.
        max_retry_after: the longest ``Retry-After`` waited for; an upstream
            asking for longer ends the request at once.
        max_backoff: the longest backoff.
    """

    max_retries: int = 3
    backoff_base: float = 0.2
    max_retry_after: float = 30.0
    max_backoff: float = 10.0

    def __post_init__(self) -> None:
        if min(self.max_retries, self.backoff_base, self.max_retry_after, self.max_backoff) < 0:
            raise ValueError(f"retry settings must be >= 0, got {self}")

    @property
    def attempts(self) -> int:
        """Attempts at most, the first included."""
        return self.max_retries + 1

    def delay(
        self,
        attempt: int,
        retry_after: float | None,
        now: float,
        deadline: float,
        rng: random.Random,
    ) -> float | None:
        """Seconds to wait after failed attempt ``attempt`` (0-based); None: give up.

        The wait is ``retry_after`` when the upstream gave one, else a jittered
        exponential backoff; a request gives up rather than wait past its
        ``deadline`` or longer than ``max_retry_after``.
        """
        if retry_after is not None and retry_after > self.max_retry_after:
            return None
        delay = self._backoff(attempt, rng) if retry_after is None else retry_after
        return None if now + delay >= deadline else delay

    def _backoff(self, attempt: int, rng: random.Random) -> float:
        ceiling = min(self.max_backoff, self.backoff_base * 2.0**attempt)
        return ceiling / 2 + rng.uniform(0, ceiling / 2)


class Throttles:
    """Each replica's ``Retry-After`` honoured once: the first of a streak of throttled answers.

    The first sets a moment that the replica's answers until then all wait for; a
    replica still throttling after it gets the normal backoff until it answers a
    request. Else an upstream that throttles every request would make each retry
    wait it out, and a job take that wait times its retries to give up.
    """

    def __init__(self) -> None:
        self._until: dict[str, float] = {}  # replica URL -> end of its honoured wait

    def honour(self, url: str, retry_after: float | None, now: float) -> float | None:
        """The wait ``url``'s ``retry_after`` still asks for at ``now``; None: the backoff."""
        if retry_after is None:
            return None
        until = self._until.get(url)
        if until is None:
            self._until[url] = now + retry_after
            return retry_after
        return until - now if now < until else None

    def answered(self, url: str) -> None:
        """``url`` answered a request: its next ``Retry-After`` is honoured again."""
        self._until.pop(url, None)


def exhausted(last: Exception | None, attempts: int) -> Exception:
    """The error of a request whose attempts all failed, ``last`` the last one's."""
    if isinstance(last, EngineProtocolError):  # an unusable answer: still one, and what it was
        return EngineProtocolError(f"no usable answer after {attempts} attempt(s): {last}")
    detail = f"after {attempts} attempt(s): {last!r}"
    if isinstance(last, httpx2.TimeoutException) and not isinstance(
        last, (httpx2.ConnectTimeout, httpx2.PoolTimeout)
    ):
        return EngineTimeout(f"upstream timed out {detail}")
    return EngineUnavailable(f"no upstream could serve {detail}")
