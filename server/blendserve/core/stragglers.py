"""When a sample in flight is a straggler: out far longer than its job's samples take.

A job that cannot see its engine's capacity keeps only a few samples in flight
per open question, so that it decides close to the sequential policy. A sample
that hangs on (a long generation, an upstream that holds the request) would
then hold one of those few slots for its whole length, and a handful of them
stop the job while the engine has room it does not show. A sample out longer
than ``multiple`` times the median time of the job's recent samples, and at
least ``floor`` seconds, is a straggler: it stays in flight and still votes if
it comes, but no longer holds a slot.

The median is of the samples that came back; the samples still out are not
known yet, so a job whose samples are all slow has no straggler (it has no
faster peers to tell them from). Times are given in, never read: no clock here.
"""

from __future__ import annotations

import statistics
from collections import deque

__all__ = ["STRAGGLER_FLOOR_S", "STRAGGLER_MULTIPLE", "Stragglers"]

#: A straggler is out longer than this many times the median of its peers' times ...
STRAGGLER_MULTIPLE = 4.0
#: ... and at least this many seconds, so that jitter on fast samples makes none.
STRAGGLER_FLOOR_S = 1.0
#: Samples that came back before the median means anything.
MIN_PEERS = 3
#: The median is of this many of the latest samples (a job's samples may lengthen).
WINDOW = 256


class Stragglers:
    """The times a job's samples took, and the age past which one still out is a straggler.

    Args:
        multiple: a straggler is out longer than this times the median ...
        floor: ... and longer than this many seconds.
        min_peers: no straggler until this many samples came back.
        window: the median is of the latest ``window`` times.
    """

    def __init__(
        self,
        multiple: float = STRAGGLER_MULTIPLE,
        floor: float = STRAGGLER_FLOOR_S,
        min_peers: int = MIN_PEERS,
        window: int = WINDOW,
    ) -> None:
        if not multiple > 0 or not floor >= 0 or min_peers < 1 or window < min_peers:
            raise ValueError("multiple must be positive, floor >= 0, 1 <= min_peers <= window")
        self.multiple = multiple
        self.floor = floor
        self.min_peers = min_peers
        self._times: deque[float] = deque(maxlen=window)
        self._after: float | None = None
        self._stale = False

    def observe(self, seconds: float) -> None:
        """Records that a sample came back ``seconds`` after it was sent."""
        self._times.append(seconds)
        self._stale = True

    def after(self) -> float | None:
        """Seconds out past which a sample is a straggler (None: too few came back to say)."""
        if self._stale:
            self._stale = False
            if len(self._times) >= self.min_peers:
                self._after = max(self.floor, self.multiple * statistics.median(self._times))
        return self._after

    def is_straggler(self, age: float) -> bool:
        """Whether a sample out ``age`` seconds is a straggler."""
        after = self.after()
        return after is not None and age > after
