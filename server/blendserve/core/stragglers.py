"""When a sample in flight is a straggler: out far longer than its job's samples take.

On an engine of unknown capacity a job keeps few samples in flight, and a few that
hang on would stop it while the engine has room. One out longer than ``multiple``
times the median of the job's recent samples, and at least ``floor`` seconds, no
longer holds a slot (docs/solve.md, "Samples in flight"). The median is of the samples
that came back, so a job whose samples are all slow has none. Times are given in.
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
    """The times a job's samples took, and the age past which one still out is a straggler."""

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
