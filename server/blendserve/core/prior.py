"""How contested a batch's or a stream's questions are: the learned prior on the leader's share.

:class:`SharePrior` is a distribution of the leader's share of the top two votes,
``x = p1 / (p1 + p2)``, over :data:`SHARES`, fitted by EM to top-two votes (the stopping
rule is ignorable for that likelihood): a batch's (:class:`~blendserve.core.worth.VoteWorth`)
and a stream's (:class:`~blendserve.core.programme.VotePrior`) alike (docs/decisions.md).
"""

from __future__ import annotations

from collections import deque
from functools import lru_cache

import numpy as np
from numpy.typing import NDArray

__all__ = ["SHARES", "SharePrior", "fit_shares", "rounded_weights"]

#: The grid of the leader's share ``x`` of the top two: even steps over [0.5, 0.98],
#: and two points near 1 for the unanimous questions.
SHARES = np.r_[np.linspace(0.5, 0.98, 25), 0.995, 1.0 - 1e-6]
_EM_ITERATIONS = 200
# Added to every grid weight in each EM step, so no share is ruled out for good.
_EM_FLOOR = 1e-4
# Top-two share assumed of a stream before any question (pseudo-counts).
_SHARE_PRIOR = (1.0, 1.0)


def fit_shares(votes: NDArray[np.float64]) -> NDArray[np.float64]:
    """Grid weights of the leader's share among the top two, fitted by EM to
    ``votes[i] = (n1, n2)``, the top-two votes of each question seen (read-only: fits of
    the same votes are one, memoised, as small batches often repeat them)."""
    # Questions with the same votes share one row, weighed by how many they are.
    rows, counts = np.unique(np.asarray(votes, np.float64), axis=0, return_counts=True)
    return _fit(rows.tobytes(), counts.astype(np.int64).tobytes())


@lru_cache(maxsize=256)
def _fit(rows: bytes, counts: bytes) -> NDArray[np.float64]:
    """:func:`fit_shares` of distinct ``(n1, n2)`` rows, each held by ``counts`` questions."""
    votes = np.frombuffer(rows, np.float64).reshape(-1, 2)
    held = np.frombuffer(counts, np.int64)
    shares = held / held.sum()
    a, b = votes[:, :1], votes[:, 1:]
    log_x, log_y = np.log(SHARES)[None], np.log1p(-SHARES)[None]
    # Scaled per question (a common factor of both terms): the EM step is unchanged
    # and no row underflows, however many votes a question holds.
    first, second = a * log_x + b * log_y, b * log_x + a * log_y
    top = np.maximum(first.max(axis=1, keepdims=True), second.max(axis=1, keepdims=True))
    likelihood = np.exp(first - top) + np.exp(second - top)
    weights = np.full(len(SHARES), 1.0 / len(SHARES))
    for _ in range(_EM_ITERATIONS):
        joint = likelihood * weights
        joint /= joint.sum(axis=1, keepdims=True)
        weights = shares @ joint + _EM_FLOOR
        weights /= weights.sum()
    weights.flags.writeable = False
    return weights


def rounded_weights(weights: NDArray[np.float64], decimals: int) -> tuple[float, ...]:
    """Grid weights rounded to ``decimals`` (none zero, summing to 1): the name under which
    priors alike share what is computed from them."""
    rounded = np.round(weights, decimals) + 10.0**-decimals
    return tuple((rounded / rounded.sum()).tolist())


class SharePrior:
    """Grid weights of the leader's share, learned from top-two votes.

    A batch refits it to its questions' votes (:meth:`fit` with ``votes``); a stream
    tells it each finished question (:meth:`observe`), and it refits to the most recent
    ``history`` of them every ``refit_every`` finished questions.
    """

    def __init__(self, *, refit_every: int = 50, history: int = 1000) -> None:
        if refit_every < 1 or history < 1:
            raise ValueError("refit_every and history must be at least 1")
        self.refit_every = refit_every
        self.weights = np.full(len(SHARES), 1.0 / len(SHARES))
        self._observed: deque[tuple[int, int]] = deque(maxlen=history)
        self._since_fit = 0
        self._top_two = list(_SHARE_PRIOR)

    @property
    def top_two_share(self) -> float:
        """The stream's share of samples that voted for a question's top two answers."""
        return self._top_two[0] / self._top_two[1]

    def observe(self, n1: int, n2: int, num_samples: int) -> None:
        """A question finished with ``n1`` and ``n2`` votes for its top two of ``num_samples``."""
        if num_samples <= 0:
            return
        self._observed.append((n1, n2))
        self._top_two[0] += n1 + n2
        self._top_two[1] += num_samples
        self._since_fit += 1
        if self._since_fit >= self.refit_every:
            self.fit()

    def fit(self, votes: NDArray[np.float64] | None = None) -> None:
        """Refits the weights (EM) to ``votes[i] = (n1, n2)``, else to the questions observed."""
        self._since_fit = 0
        if votes is None:
            if not self._observed:
                return
            votes = np.asarray(self._observed, dtype=np.float64)
        self.weights = fit_shares(votes)

    def key(self, decimals: int) -> tuple[float, ...]:
        """The weights rounded to ``decimals``: priors alike share what is computed from them."""
        return rounded_weights(self.weights, decimals)
