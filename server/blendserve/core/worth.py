"""What further votes of a batch's question are worth, under the batch's learned prior.

Where ASC assumes a flat prior on the leader's share, :class:`VoteWorth` fits it to the
batch's own votes (:class:`~blendserve.core.prior.SharePrior`) and values a question by
the most that further top-two votes lower the chance that its leader is not the mode, per
vote: the best over 1 to :data:`LOOK_AHEAD` more votes (one vote often cannot turn a
count, a few can). Where most questions are close, that keeps sampling a question whose
first votes agree by luck and spends less on near-ties a few votes will not break; where
most are clear, it is close to ASC. Pure; memoised per fitted prior.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
from numpy.typing import NDArray
from scipy import special

from blendserve.core.prior import SHARES, SharePrior

__all__ = ["LOOK_AHEAD", "VoteWorth"]

#: Further top-two votes a value looks ahead at most.
LOOK_AHEAD = 8
# Grid weights are rounded to this many decimals to name a prior (values are memoised per name).
_DECIMALS = 3
# Each fit tables the chances of every state with fewer top-two votes than this each;
# values are tabled for states LOOK_AHEAD fewer.
_SPAN = 192
_TABLED = _SPAN - LOOK_AHEAD
_LOG_X = np.log(SHARES)
_LOG_Y = np.log1p(-SHARES)
# A fall in the error this small next to the error is rounding: no fall.
_ROUNDING = 1e-12
# A row's later samples are worth this much less in log space than equal earlier ones.
_TIE = 1e-9
# Rows of expected errors are computed this many votes long at least (and in multiples of it).
_ROW_STEP = 16
# A chance past the table under this is summed in log space: a product's terms that
# underflowed are then at most 1e-28 of their sum.
_SMALLEST = 1e-280


@dataclass(frozen=True)
class _Chances:
    """Under one prior, for every state ``(a, b)`` of fewer than ``_SPAN`` votes each: the
    chance of its votes (``total``) and of its votes with its leader not the mode
    (``error``), on one scale (so ``error / total`` is the posterior error)."""

    error: NDArray[np.float64]
    total: NDArray[np.float64]
    values: NDArray[np.float64]  # each state's value, for states of fewer than _TABLED


@lru_cache(maxsize=4)
def _chances(weights: tuple[float, ...]) -> _Chances:
    """The chances and values of a prior's states: one product over the grid."""
    votes = np.arange(_SPAN, dtype=np.float64)
    # leader[a, b] = sum over the grid of w x^a (1 - x)^b: the answer with a votes is the mode.
    leader = (np.asarray(weights) * np.exp(np.outer(votes, _LOG_X))) @ np.exp(
        np.outer(_LOG_Y, votes)
    )
    error, total = np.minimum(leader, leader.T), leader + leader.T
    size = _TABLED
    now = error[:size, :size]
    best = np.zeros((size, size))
    for w in range(1, LOOK_AHEAD + 1):
        expected = sum(
            math.comb(w, j) * error[j : j + size, w - j : w - j + size] for j in range(w + 1)
        )
        best = np.maximum(best, (now - expected) / w)
    best[best <= _ROUNDING * now] = 0.0
    with np.errstate(invalid="ignore", divide="ignore"):
        values = np.nan_to_num(best / total[:size, :size])
    for array in (error, total, values):
        array.flags.writeable = False
    return _Chances(error, total, values)


def _expected_errors(
    weights: tuple[float, ...], n1: int, n2: int, votes: int
) -> NDArray[np.float64]:
    """``errors[j]``: the chance that the leader of ``(n1, n2)`` is not the mode after
    ``j`` more top-two votes (the posterior's expectation), for ``j < votes``."""
    if n1 + votes <= _SPAN and n2 + votes <= _SPAN:
        chances = _chances(weights)
        # errors[j] sums, over i of the j votes for the leader, C(j, i) times the error
        # at (n1 + i, n2 + j - i) times its chance, relative to the chance of (n1, n2).
        j, i = np.tril_indices(votes)
        terms = special.comb(j, i) * chances.error[n1 + i, n2 + j - i]
        errors = np.bincount(j, terms, minlength=votes) / chances.total[n1, n2]
        return np.asarray(errors, np.float64)
    return _expected_errors_far(weights, n1, n2, votes)


@lru_cache(maxsize=32)
def _powers(votes: int) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """``x ** i`` and ``(1 - x) ** i`` over the grid, a row for each ``i < votes``."""
    i = np.arange(votes, dtype=np.float64)[:, None]
    xs, ys = SHARES[None] ** i, (1.0 - SHARES)[None] ** i
    xs.flags.writeable = ys.flags.writeable = False  # shared by every caller
    return xs, ys


@lru_cache(maxsize=32)
def _log_combinations(votes: int) -> tuple[NDArray[np.float64], NDArray[np.int64]]:
    """``log C(j, i)`` at ``[j, i]`` (minus infinity past ``i = j``), and ``j - i`` (0 there)."""
    j = np.arange(votes, dtype=np.float64)[:, None]
    i = np.arange(votes, dtype=np.float64)[None, :]
    log_comb = special.gammaln(j + 1.0) - special.gammaln(i + 1.0) - special.gammaln(j - i + 1.0)
    log_comb, others = np.where(i <= j, log_comb, -np.inf), np.maximum(j - i, 0).astype(np.int64)
    log_comb.flags.writeable = others.flags.writeable = False  # shared by every caller
    return log_comb, others


def _log_sum_exp(x: NDArray[np.float64], axis: int) -> NDArray[np.float64]:
    """``log(sum(exp(x)))`` along ``axis``: scipy's without its per-call dispatch, which
    costs more than the sum at these sizes."""
    top = np.max(x, axis=axis, keepdims=True)
    top[~np.isfinite(top)] = 0.0
    with np.errstate(divide="ignore"):
        summed = np.log(np.sum(np.exp(x - top), axis=axis))
    return np.asarray(summed + np.squeeze(top, axis=axis), np.float64)


def _log_chances(log_w: NDArray[np.float64], n1: int, n2: int, votes: int) -> NDArray[np.float64]:
    """``[i, j]``: the log of the chance of ``(n1 + i, n2 + j)`` with the first answer the
    mode, for ``i, j < votes``: one matrix product, scaled at ``(n1, n2)``; summed in log
    space instead where a chance is too small for the product's terms to keep their sum."""
    xs, ys = _powers(votes)
    base = log_w + n1 * _LOG_X + n2 * _LOG_Y
    top = float(base.max())
    chances = (xs * np.exp(base - top)) @ ys.T
    if chances.min() >= _SMALLEST:
        return np.asarray(np.log(chances) + top, np.float64)
    a = (n1 + np.arange(votes, dtype=np.float64))[:, None, None]
    b = (n2 + np.arange(votes, dtype=np.float64))[None, :, None]
    return np.asarray(special.logsumexp(log_w + a * _LOG_X + b * _LOG_Y, axis=2), np.float64)


@lru_cache(maxsize=1 << 12)
def _expected_errors_far(
    weights: tuple[float, ...], n1: int, n2: int, votes: int
) -> NDArray[np.float64]:
    """:func:`_expected_errors` past the table, in log space."""
    log_w = np.log(np.asarray(weights))
    first = _log_chances(log_w, n1, n2, votes)
    second = _log_chances(log_w, n2, n1, votes).T
    log_error = np.minimum(first, second)
    log_comb, others = _log_combinations(votes)
    # terms[j, i]: i of the j votes for the leader, the rest for the other answer.
    terms = log_comb + log_error[np.arange(votes)[None, :], others]
    errors = np.exp(_log_sum_exp(terms, axis=1) - np.logaddexp(first[0, 0], second[0, 0]))
    errors.flags.writeable = False
    return np.asarray(errors, np.float64)


def _falls(errors: NDArray[np.float64], count: int) -> NDArray[np.float64]:
    """``falls[j]``: the best per-vote fall in ``errors`` from ``j``, over 1 to LOOK_AHEAD
    votes, for ``j < count`` (``errors`` is at least ``count + LOOK_AHEAD`` long)."""
    falls = np.zeros(count)
    for w in range(1, LOOK_AHEAD + 1):
        falls = np.maximum(falls, (errors[:count] - errors[w : count + w]) / w)
    falls[falls <= _ROUNDING * errors[:count]] = 0.0
    return falls


@lru_cache(maxsize=1 << 12)
def _value(weights: tuple[float, ...], n1: int, n2: int) -> float:
    """The value of one state past the table."""
    return float(_falls(_expected_errors(weights, n1, n2, LOOK_AHEAD + 1), 1)[0])


class VoteWorth:
    """A batch's learned prior on its questions' leading shares, and what a vote is worth;
    refitted every ``refit_every`` votes (the fit reads every question's votes)."""

    def __init__(self, refit_every: int = 64) -> None:
        if refit_every < 1:
            raise ValueError(f"refit_every must be at least 1, got {refit_every}")
        self.refit_every = refit_every
        self._since_fit = 0
        self.prior = SharePrior()
        self._name = self.prior.key(_DECIMALS)
        self._table = _chances(self._name).values

    @property
    def weights(self) -> tuple[float, ...]:
        """The fitted grid weights (rounded), over :data:`~blendserve.core.prior.SHARES`."""
        return self._name

    def due(self) -> bool:
        """Counts one vote; whether a refit is due."""
        self._since_fit += 1
        return self._since_fit >= self.refit_every

    def fit(self, votes: NDArray[np.float64]) -> bool:
        """Refits to ``votes[i] = (n1, n2)`` of the questions with votes; whether worths changed."""
        self._since_fit = 0
        votes = votes[votes.sum(axis=1) > 0]
        if not len(votes):
            return False
        self.prior.fit(votes)
        name = self.prior.key(_DECIMALS)
        changed, self._name = name != self._name, name
        self._table = _chances(name).values
        return changed

    def worth(self, n1: int, n2: int) -> float:
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
        return np.asarray(np.minimum.accumulate(gains) - _TIE * np.arange(samples), np.float64)

    def unanimous(self, n1: int, n2: int, share: float, log_price: float, limit: int) -> int:
        """Further samples, all for the leader, after which a sample is worth at most
        ``log_price`` (at most ``limit``)."""
        for m in range(limit):
            worth = share * self.worth(n1 + m, n2)
            if worth <= 0 or math.log(worth) <= log_price:
                return m
        return limit
