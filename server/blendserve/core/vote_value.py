"""What one more sample of a question is worth, under how contested the batch's questions are.

ASC ranks questions by ``P[p1 < p2]`` under a flat prior on the leader's
share, the same for every batch. :class:`VoteValue` learns that share's
distribution, ``x = p1 / (p1 + p2)``, from the batch's own votes (the grid
and EM fit of :mod:`blendserve.core.vote_prior`) and values a question by
the most that further top-two votes can lower the chance that its leader is
not the mode, per vote: the best over 1 to :data:`LOOK_AHEAD` more votes (one
vote often cannot turn a count, a few can). Where most questions are close,
that keeps sampling a question whose first votes agree (agreement by luck is
common there) and spends less on near-ties that a few votes will not break;
where most are clear, it is close to ASC. The policy samples the question of
highest value first.

Pure; memoised per fitted prior.
"""

from __future__ import annotations

import math
from functools import lru_cache

import numpy as np
from numpy.typing import NDArray
from scipy import special

from blendserve.core.vote_prior import SHARES, fit_shares

__all__ = ["LOOK_AHEAD", "VoteValue"]

#: Further top-two votes a value looks ahead at most.
LOOK_AHEAD = 8
# Grid weights are rounded to this many decimals to name a prior (values are memoised per name).
_DECIMALS = 3
# Values of states with fewer top-two votes than this each are tabled at each fit.
_TABLED = 128
_LOG_X = np.log(SHARES)
_LOG_Y = np.log1p(-SHARES)
# _COMB[w, j]: ways to place j of w votes on the leader.
_COMB = special.comb(np.arange(LOOK_AHEAD + 1)[:, None], np.arange(LOOK_AHEAD + 1)[None, :])


def _values(weights: tuple[float, ...], n1: int, n2: int, size: int) -> NDArray[np.float64]:
    """``values[i, j]``: the best per-vote fall, over 1 to LOOK_AHEAD more top-two votes,
    in the chance that the leader of ``(n1 + i, n2 + j)`` is not the mode, under the grid
    ``weights``."""
    log_w = np.log(np.asarray(weights))
    a = (n1 + np.arange(size + LOOK_AHEAD, dtype=np.float64))[:, None, None]
    b = (n2 + np.arange(size + LOOK_AHEAD, dtype=np.float64))[None, :, None]
    # Log chances of the votes (a, b) at each share, the leader (first) or the
    # runner-up (second) being the mode; one scale for all, so none is normalised.
    first = log_w + a * _LOG_X + b * _LOG_Y
    second = log_w + b * _LOG_X + a * _LOG_Y
    top = max(float(first.max()), float(second.max()))
    leader, runner_up = np.exp(first - top).sum(axis=2), np.exp(second - top).sum(axis=2)
    error = np.minimum(leader, runner_up)  # the error after the votes, times their chance
    now = error[:size, :size]
    total = leader[:size, :size] + runner_up[:size, :size]
    best = np.zeros((size, size))
    for w in range(1, LOOK_AHEAD + 1):
        expected = sum(
            _COMB[w, j] * error[j : j + size, w - j : w - j + size] for j in range(w + 1)
        )
        best = np.maximum(best, (now - expected) / w)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.asarray(np.nan_to_num(best / total), np.float64)


@lru_cache(maxsize=4)
def _table(weights: tuple[float, ...]) -> NDArray[np.float64]:
    """The values of every state with fewer than ``_TABLED`` votes each."""
    table = _values(weights, 0, 0, _TABLED)
    table.flags.writeable = False
    return table


# A row's later samples are worth this much less in log space than equal earlier ones.
_TIE = 1e-9
# Rows of expected errors are computed this many votes long at least (and in multiples of it).
_ROW_STEP = 16


@lru_cache(maxsize=1 << 12)
def _expected_errors(
    weights: tuple[float, ...], n1: int, n2: int, votes: int
) -> NDArray[np.float64]:
    """``errors[j]``: the chance that the leader of ``(n1, n2)`` is not the mode after
    ``j`` more top-two votes (the posterior's expectation), for ``j < votes``."""
    log_w = np.log(np.asarray(weights))
    a = (n1 + np.arange(votes, dtype=np.float64))[:, None, None]
    b = (n2 + np.arange(votes, dtype=np.float64))[None, :, None]
    first = special.logsumexp(log_w + a * _LOG_X + b * _LOG_Y, axis=2)
    second = special.logsumexp(log_w + b * _LOG_X + a * _LOG_Y, axis=2)
    log_error = np.minimum(first, second)
    # errors[j] sums, over i of the j votes for the leader, C(j, i) times the error at
    # (n1 + i, n2 + j - i) times its chance, relative to the chance of (n1, n2).
    j = np.arange(votes)[:, None]
    i = np.arange(votes)[None, :]
    valid = i <= j
    log_comb = special.gammaln(j + 1.0) - special.gammaln(i + 1.0) - special.gammaln(j - i + 1.0)
    terms = np.where(valid, log_comb + log_error[i, np.where(valid, j - i, 0)], -np.inf)
    errors = np.exp(special.logsumexp(terms, axis=1) - np.logaddexp(first[0, 0], second[0, 0]))
    errors.flags.writeable = False
    return np.asarray(errors, np.float64)


def _falls(errors: NDArray[np.float64], count: int) -> NDArray[np.float64]:
    """``falls[j]``: the best per-vote fall in ``errors`` from ``j``, over 1 to LOOK_AHEAD
    votes, for ``j < count`` (``errors`` is at least ``count + LOOK_AHEAD`` long)."""
    falls = np.zeros(count)
    for w in range(1, LOOK_AHEAD + 1):
        falls = np.maximum(falls, (errors[:count] - errors[w : count + w]) / w)
    return falls


@lru_cache(maxsize=1 << 12)
def _value(weights: tuple[float, ...], n1: int, n2: int) -> float:
    """The value of one state past the table."""
    return float(_falls(_expected_errors(weights, n1, n2, LOOK_AHEAD + 1), 1)[0])


class VoteValue:
    """A batch's learned prior on its questions' leading shares, and the value of a vote.

    Args:
        refit_every: votes between fits (the fit reads every question's votes).
    """

    def __init__(self, refit_every: int = 64) -> None:
        if refit_every < 1:
            raise ValueError(f"refit_every must be at least 1, got {refit_every}")
        self.refit_every = refit_every
        self._since_fit = 0
        self._name = _named(np.full(len(SHARES), 1.0 / len(SHARES)))
        self._table = _table(self._name)

    @property
    def weights(self) -> tuple[float, ...]:
        """The fitted grid weights (rounded), over :data:`~blendserve.core.vote_prior.SHARES`."""
        return self._name

    def due(self) -> bool:
        """Counts one vote; whether a refit is due."""
        self._since_fit += 1
        return self._since_fit >= self.refit_every

    def fit(self, votes: NDArray[np.float64]) -> bool:
        """Refits to ``votes[i] = (n1, n2)`` of the questions with votes; whether values changed."""
        self._since_fit = 0
        votes = votes[votes.sum(axis=1) > 0]
        if not len(votes):
            return False
        name = _named(fit_shares(votes))
        changed, self._name = name != self._name, name
        self._table = _table(name)
        return changed

    def value(self, n1: int, n2: int) -> float:
        """How much one more top-two vote lowers, at best, the chance that the leader is
        wrong (per vote, over 1 to :data:`LOOK_AHEAD` votes): larger is sampled first."""
        if n1 < _TABLED and n2 < _TABLED:
            return float(self._table[n1, n2])
        return _value(self._name, n1, n2)

    def log_gains(self, n1: int, n2: int, share: float, samples: int) -> NDArray[np.float64]:
        """``gains[s]``: the log of what the ``s``-th further sample is expected to lower the
        chance that the leader is wrong, for ``s < samples``: the best per-vote fall over 1
        to :data:`LOOK_AHEAD` votes after the votes before it, a sample voting for the top
        two at ``share``. Non-increasing: the rows a wave plan allocates a budget over."""
        votes = math.ceil(samples * share) + LOOK_AHEAD + 1
        votes = -(-votes // _ROW_STEP) * _ROW_STEP
        falls = _falls(_expected_errors(self._name, n1, n2, votes), votes - LOOK_AHEAD)
        before = np.floor(np.arange(samples) * share).astype(np.int64)
        with np.errstate(divide="ignore"):
            gains = np.log(share * falls[before])
        # Samples that share a vote's gain are told apart, the earlier first: a plan's
        # threshold then falls between them, not on all of them.
        return np.minimum.accumulate(gains) - _TIE * np.arange(samples)

    def unanimous(self, n1: int, n2: int, share: float, log_tau: float, limit: int) -> int:
        """Further samples, all for the leader, after which a sample is worth at most
        ``log_tau`` (at most ``limit``)."""
        for m in range(limit):
            worth = share * self.value(n1 + m, n2)
            if worth <= 0 or math.log(worth) <= log_tau:
                return m
        return limit


def _named(weights: NDArray[np.float64]) -> tuple[float, ...]:
    """The weights rounded: batches alike share memoised values."""
    rounded = np.round(weights, _DECIMALS) + 10.0**-_DECIMALS
    return tuple((rounded / rounded.sum()).tolist())
