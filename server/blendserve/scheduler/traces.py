"""What each client's traffic taught about its traces, kept across its requests.

One :class:`~blendserve.core.traces.TraceLearner` per (client, model): a client's
samples of one model tell which of their signals mark the samples that agree with the
answer; another client's, or another model's, need not. :class:`TraceLearners` makes
them when first asked for and forgets the least recently asked for beyond its bound, as
a pool forgets its clients (:class:`~blendserve.scheduler.clients.Clients`).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator

from blendserve.core.traces import TraceLearner

__all__ = ["MAX_LEARNERS", "TraceLearners"]

#: Learners kept at most (as a pool's clients).
MAX_LEARNERS = 1024


class TraceLearners:
    """The learners of ``(client, model)`` pairs, at most ``max_learners`` of them (the
    least recently asked for go first; one that comes back starts learning afresh)."""

    def __init__(self, max_learners: int = MAX_LEARNERS) -> None:
        if max_learners < 1:
            raise ValueError(f"max_learners must be at least 1, got {max_learners}")
        self.max_learners = max_learners
        self._learners: OrderedDict[tuple[str, str | None], TraceLearner] = OrderedDict()

    def __len__(self) -> int:
        return len(self._learners)

    def __iter__(self) -> Iterator[tuple[str, str | None]]:
        """The ``(client, model)`` pairs kept, least recently asked for first."""
        return iter(list(self._learners))

    def get(self, client: str, model: str | None) -> TraceLearner:
        """``client``'s learner for ``model`` (None: the engine's default), made if new."""
        key = (client, model)
        learner = self._learners.get(key)
        if learner is not None:
            self._learners.move_to_end(key)
            return learner
        while len(self._learners) >= self.max_learners:
            self._learners.popitem(last=False)
        learner = self._learners[key] = TraceLearner()
        return learner
