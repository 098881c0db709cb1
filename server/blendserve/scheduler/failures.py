"""A streak of engine failures: the backoff before retrying, and when to give up."""

from __future__ import annotations

import logging
import math

from blendserve.errors import (
    EngineDown,
    EngineError,
    EngineTimeout,
    EngineUnavailable,
    UpstreamRejected,
)

__all__ = ["FailureStreak", "backoff_s"]

_log = logging.getLogger(__name__)

_BACKOFF_S = 0.05  # first wait before failed samples are sent again, doubled per failure
_MAX_BACKOFF_S = 1.0


def backoff_s(num_failures: int) -> float:
    """Seconds to wait after ``num_failures`` failures in a row: 50 ms doubling to 1 s."""
    return min(_MAX_BACKOFF_S, _BACKOFF_S * 2.0 ** min(num_failures - 1, 16))


class FailureStreak:
    """Engine failures with no success in between: the backoff, and when the job gives up.

    ``limit`` failures in a row end the job; transient ones (``EngineUnavailable``:
    every upstream down or its breaker open; ``EngineTimeout``) only once the streak
    has also lasted ``timeout`` seconds, and then at that moment even with requests in
    flight (:meth:`deadline`, :meth:`expired`): a hung upstream holds a job for one
    request timeout plus ``timeout``, not ``limit`` of them. A refused request
    (:class:`~blendserve.errors.UpstreamRejected`) or a dead engine server
    (:class:`~blendserve.errors.EngineDown`) ends it at once.
    """

    def __init__(self, limit: int, timeout: float) -> None:
        self.limit = limit
        self.timeout = timeout
        self.count = 0
        self.started = 0.0  # when the current streak began
        self.last: BaseException | None = None  # its latest failure
        self.resume_at = -math.inf  # no dispatch before this
        self.error: str | None = None  # why the job gave up
        self.cause: BaseException | None = None

    def backoff(self, now: float) -> float:
        """Seconds to wait before the next dispatch (0 once the job gave up)."""
        return self.resume_at - now if self.error is None else 0.0

    def deadline(self) -> float | None:
        """When a streak of transient failures ends the job if no success comes first."""
        if self.error is not None or not _transient(self.last):
            return None
        return self.started + self.timeout

    def succeeded(self) -> None:
        """A request came back: the streak and its backoff end."""
        self.count = 0
        self.last = None
        self.resume_at = -math.inf

    def failed(self, exc: BaseException, now: float) -> bool:
        """Counts a failure; True if it is the one that ends the job."""
        if self.count == 0:
            self.started = now
        self.count += 1
        self.last = exc
        self.resume_at = now + backoff_s(self.count)
        if self.error is not None:
            return False
        # The request itself, or a dead engine server: no retry helps.
        if isinstance(exc, (UpstreamRejected, EngineDown)):
            return self._end(exc, now)
        if self.count < self.limit or (_transient(exc) and now - self.started < self.timeout):
            return False
        return self._end(exc, now)

    def expired(self, now: float) -> bool:
        """True once (the job ends now) when the transient streak outlasted its deadline."""
        deadline = self.deadline()
        if deadline is None or now < deadline or self.last is None:
            return False
        return self._end(self.last, now)

    def _end(self, exc: BaseException, now: float) -> bool:
        if isinstance(exc, EngineError):
            detail = str(exc)
        else:  # a bug: its words and traceback are for the log, not the caller
            _log.error("engine request failed with an internal error", exc_info=exc)
            detail = "an internal error (the server's log has the details)"
        lasted = now - self.started
        if isinstance(exc, EngineDown):
            self.error = detail
        else:
            self.error = f"engine failed {self.count} times in a row over {lasted:.1f} s: {detail}"
        self.cause = exc
        return True


def _transient(exc: BaseException | None) -> bool:
    return isinstance(exc, (EngineUnavailable, EngineTimeout))
