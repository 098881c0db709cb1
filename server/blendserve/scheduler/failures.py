"""A streak of engine failures: the backoff before retrying, and when to give up."""

from __future__ import annotations

import logging
import math

from blendserve.errors import EngineError, EngineTimeout, EngineUnavailable

__all__ = ["FailureStreak", "backoff_s"]

_log = logging.getLogger(__name__)

_BACKOFF_S = 0.05  # first wait before failed samples are sent again, doubled per failure
_MAX_BACKOFF_S = 1.0


def backoff_s(num_failures: int) -> float:
    """Seconds to wait after ``num_failures`` failures in a row: 50 ms doubling to 1 s."""
    return min(_MAX_BACKOFF_S, _BACKOFF_S * 2.0 ** min(num_failures - 1, 16))


class FailureStreak:
    """Engine failures with no success in between: the backoff, and when the job gives up.

    A streak lasts from when its first failed request was sent (or the last
    success, if later). It ends the job after ``limit`` failures, once it also
    lasts ``timeout`` seconds when they are transient (every upstream down or
    its breaker open fails at once, so a few seconds of them say more than
    their count). A request that timed out says the upstream produced nothing
    for its whole deadline: a timeout ends the job as soon as the streak lasts
    ``timeout``, whatever the count, so a hung upstream holds a job for about
    one request timeout plus ``timeout``, not ``limit`` request timeouts.

    Args:
        limit: failures in a row that end the job.
        timeout: seconds a streak of transient failures must also last.
    """

    def __init__(self, limit: int, timeout: float) -> None:
        self.limit = limit
        self.timeout = timeout
        self.count = 0
        self.started = 0.0  # when the current streak began
        self.last_success = -math.inf
        self.resume_at = -math.inf  # no dispatch before this
        self.error: str | None = None  # why the job gave up
        self.cause: BaseException | None = None

    def backoff(self, now: float) -> float:
        """Seconds to wait before the next dispatch (0 once the job gave up)."""
        return self.resume_at - now if self.error is None else 0.0

    def succeeded(self, now: float = -math.inf) -> None:
        """A request came back (at ``now``): the streak and its backoff end."""
        self.count = 0
        self.resume_at = -math.inf
        self.last_success = max(self.last_success, now)

    def failed(self, exc: BaseException, now: float, sent: float | None = None) -> bool:
        """Counts a failure of a request sent at ``sent``; True if it is the one that ends
        the job."""
        if self.count == 0:
            self.started = max(now if sent is None else sent, self.last_success)
        self.count += 1
        self.resume_at = now + backoff_s(self.count)
        lasted = now - self.started
        timed_out = isinstance(exc, EngineTimeout) and lasted >= self.timeout
        if self.error is not None or (self.count < self.limit and not timed_out):
            return False
        transient = isinstance(exc, (EngineUnavailable, EngineTimeout))
        if transient and lasted < self.timeout:
            return False
        if isinstance(exc, EngineError):
            detail = str(exc)
        else:  # a bug: its words and traceback are for the log, not the caller
            _log.error("engine request failed with an internal error", exc_info=exc)
            detail = "an internal error (the server's log has the details)"
        self.error = f"engine failed {self.count} times in a row over {lasted:.1f} s: {detail}"
        self.cause = exc
        return True
