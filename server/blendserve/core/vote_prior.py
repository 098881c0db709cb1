"""Waves for a stream of questions, planned against what the stream's past questions looked like.

A question of a stream gets at most ``R`` waves. Which sizes are best
depends on how contested the stream's questions tend to be: where most are
near-unanimous a small first wave settles them; where many are close, a
question whose first votes agree is often still wrong. :class:`VotePrior`
learns that from the stream itself, as a distribution of each question's
share ``x = p1 / (p1 + p2)`` of its leading answer among its top two (a
grid, fitted by EM to the finished questions' top-two votes; the stopping
rule is ignorable for that likelihood). Given it, the waves are the Bayes
optimal ones of a dynamic programme over the vote state ``(n1, n2)`` and the
rounds left: each round either stops, with the posterior chance that the
leader is not the mode as its cost, or buys ``w`` more top-two votes at a
``price`` each. The price plays the part of the online rule's ``tau``: the
stream's pacing learns it so that the mean spend meets the budget.

Samples that vote for neither of the top two answers are not votes the
programme counts; a wave of ``w`` votes is sent as ``w`` divided by the
question's (else the stream's) share of top-two votes. Pure; the pools and
the simulator's online method share it.
"""

from __future__ import annotations

import math
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from functools import lru_cache

import numpy as np
from numpy.typing import NDArray
from scipy import stats

__all__ = ["SHARES", "VotePrior", "start_log_price"]

#: The grid of the leader's share ``x`` of the top two: even steps over [0.5, 0.98],
#: and two points near 1 for the unanimous questions.
SHARES = np.r_[np.linspace(0.5, 0.98, 25), 0.995, 1.0 - 1e-6]
# Wave sizes the programme chooses among (top-two votes).
_SIZES = (1, 2, 3, 4, 5, 6, 7, 8, 10, 12, 14, 16, 20, 24, 28, 32, 40, 48, 56, 64)
# Log-price buckets: tables are computed once per bucket.
_STEP = 0.1
_EM_ITERATIONS = 200
# Added to every grid weight in each EM step, so no share is ruled out for good.
_EM_FLOOR = 1e-4
# Top-two share assumed of a stream before any question (pseudo-counts).
_SHARE_PRIOR = (1.0, 1.0)
# A wave is sized for a top-two share of at least this.
_MIN_SHARE = 0.2
# log_price_for searches between these.
_MIN_LOG_PRICE = -16.0
_MAX_LOG_PRICE = 0.0
# More rounds left than this are planned as this many.
_MAX_ROUNDS = 8
# Price buckets whose tables a programme keeps, and programmes kept in memory
# (each a few MB; streams whose priors are alike share one).
_MAX_TABLES = 16
_MAX_PROGRAMMES = 16
# Grid weights are rounded to this many decimals to name a programme.
_DECIMALS = 4


@lru_cache(maxsize=len(_SIZES))
def _pmf(w: int) -> NDArray[np.float64]:
    """``pmf[j, k]``: chance of ``j`` of ``w`` votes for an answer of share ``SHARES[k]``."""
    return np.asarray(stats.binom.pmf(np.arange(w + 1)[:, None], w, SHARES[None]), np.float64)


@dataclass
class _Tables:
    """The programme at one price: for 0, 1, ... rounds left, each state's wave and its
    expected further votes; for the most rounds so far, each state's expected value."""

    log_price: float
    value: NDArray[np.float64]
    waves: list[NDArray[np.uint8]] = field(default_factory=list)
    spends: list[NDArray[np.float64]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.waves.append(np.zeros(self.value.shape, dtype=np.uint8))
        self.spends.append(np.zeros(self.value.shape))


class _Programme:
    """The dynamic programme of one prior: posterior error, predictives, tables per price."""

    def __init__(self, weights: NDArray[np.float64], max_votes: int) -> None:
        self.max_votes = max_votes
        size = max_votes + 1
        n = np.arange(size, dtype=np.float64)
        a, b = n[None, :, None], n[None, None, :]
        x = SHARES[:, None, None]
        log_w = np.log(weights)[:, None, None]
        first = log_w + a * np.log(x) + b * np.log1p(-x)  # the first answer is the mode
        second = log_w + b * np.log(x) + a * np.log1p(-x)
        top = np.maximum(first.max(axis=0), second.max(axis=0))[None]
        first, second = np.exp(first - top), np.exp(second - top)
        total = first.sum(axis=0) + second.sum(axis=0)
        first, second = first / total, second / total
        first_is_mode = first.sum(axis=0)
        self.error = np.minimum(first_is_mode, 1.0 - first_is_mode)
        # predictive[w][j, a, b]: the chance at (a, b) that j of w more votes go to the
        # first answer, a mixture of binomials over the posterior (when the second
        # answer is the mode, the first one's votes are its w - j).
        self.sizes = [w for w in _SIZES if w <= max_votes]
        self._predictive: dict[int, NDArray[np.float32]] = {}
        for w in self.sizes:
            m = size - w
            pmf = _pmf(w)
            head = first[:, :m, :m].reshape(len(SHARES), m * m)
            tail = second[:, :m, :m].reshape(len(SHARES), m * m)
            mixture = (pmf @ head + pmf[::-1] @ tail).reshape(w + 1, m, m)
            self._predictive[w] = mixture.astype(np.float32)
        self._tables: OrderedDict[int, _Tables] = OrderedDict()

    def _expect(self, table: NDArray[np.float64], w: int) -> NDArray[np.float64]:
        """``table`` expected after ``w`` more top-two votes, at every state that has room."""
        m = self.max_votes + 1 - w
        step0, step1 = table.strides
        # diagonals[j, a, b] = table[a + j, b + w - j]: j of the w votes for the first answer.
        diagonals = np.lib.stride_tricks.as_strided(
            table.ravel()[w:], shape=(w + 1, m, m), strides=(step0 - step1, step0, step1)
        )
        expected = np.einsum("jab,jab->ab", self._predictive[w], diagonals, dtype=np.float64)
        return np.asarray(expected, np.float64)

    def _extend(self, tables: _Tables, rounds: int) -> None:
        """Adds rounds to ``tables`` until it covers ``rounds`` rounds left."""
        size = self.max_votes + 1
        price = math.exp(tables.log_price)
        votes = np.add.outer(np.arange(size), np.arange(size))
        while len(tables.waves) <= rounds:
            best = self.error.copy()
            spend = np.zeros((size, size))
            choice = np.zeros((size, size), dtype=np.uint8)
            for w in self.sizes:
                m = size - w
                expected = self._expect(tables.value, w)
                further = self._expect(tables.spends[-1], w)
                cost = price * w + expected
                cost[votes[:m, :m] + w > self.max_votes] = np.inf
                cheaper = cost < best[:m, :m]
                best[:m, :m][cheaper] = cost[cheaper]
                spend[:m, :m][cheaper] = w + further[cheaper]
                choice[:m, :m][cheaper] = w
            tables.value = best
            tables.spends.append(spend)
            tables.waves.append(choice)

    def tables(self, log_price: float, rounds_left: int) -> _Tables:
        """The tables at ``log_price``'s bucket, covering ``rounds_left`` (at most 8) rounds."""
        bucket = round(log_price / _STEP)
        tables = self._tables.get(bucket)
        if tables is None:
            tables = self._tables[bucket] = _Tables(bucket * _STEP, self.error.copy())
            while len(self._tables) > _MAX_TABLES:
                self._tables.popitem(last=False)
        else:
            self._tables.move_to_end(bucket)
        self._extend(tables, min(rounds_left, _MAX_ROUNDS))
        return tables


@lru_cache(maxsize=_MAX_PROGRAMMES)
def _programme(weights: tuple[float, ...], max_votes: int) -> _Programme:
    return _Programme(np.asarray(weights), max_votes)


class VotePrior:
    """A stream's learned distribution of how contested its questions are, and the waves it implies.

    Args:
        max_votes: top-two votes a question may hold in the programme.
        refit_every: finished questions between EM fits.
        history: the most recent finished questions the fit uses.
    """

    def __init__(self, *, max_votes: int = 64, refit_every: int = 50, history: int = 1000) -> None:
        if not 1 <= max_votes <= 255 or refit_every < 1 or history < 1:
            raise ValueError("max_votes must be in [1, 255], refit_every and history at least 1")
        self.max_votes = max_votes
        self.refit_every = refit_every
        self._observed: deque[tuple[int, int]] = deque(maxlen=history)
        self._since_fit = 0
        self._top_two = list(_SHARE_PRIOR)
        self.weights = np.full(len(SHARES), 1.0 / len(SHARES))
        self._key = self._name()

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

    def fit(self) -> None:
        """Refits the grid's weights to the questions seen (EM)."""
        self._since_fit = 0
        if not self._observed:
            return
        votes = np.asarray(self._observed, dtype=np.float64)
        a, b = votes[:, :1], votes[:, 1:]
        log_x, log_y = np.log(SHARES)[None], np.log1p(-SHARES)[None]
        likelihood = np.exp(a * log_x + b * log_y) + np.exp(b * log_x + a * log_y)
        weights = np.full(len(SHARES), 1.0 / len(SHARES))
        for _ in range(_EM_ITERATIONS):
            joint = likelihood * weights
            joint /= joint.sum(axis=1, keepdims=True)
            weights = joint.mean(axis=0) + _EM_FLOOR
            weights /= weights.sum()
        self.weights = weights
        self._key = self._name()

    def _name(self) -> tuple[float, ...]:
        """The weights rounded: priors alike share one programme."""
        rounded = np.round(self.weights, _DECIMALS) + 10.0**-_DECIMALS
        return tuple((rounded / rounded.sum()).tolist())

    def _programme(self) -> _Programme:
        return _programme(self._key, self.max_votes)

    def wave(self, n1: int, n2: int, num_samples: int, log_price: float, rounds_left: int) -> int:
        """Samples to send next for a question with these votes (0: it stops).

        Args:
            n1: votes of the leading answer.
            n2: votes of the runner-up.
            num_samples: samples observed (other answers and abstentions included).
            log_price: the log price of a top-two vote, in units of error (the paced ``tau``).
            rounds_left: waves it may still take, this one included.
        """
        if rounds_left <= 0:
            return 0
        n1, n2 = min(n1, self.max_votes), min(n2, self.max_votes)
        tables = self._programme().tables(log_price, rounds_left)
        votes = int(tables.waves[min(rounds_left, _MAX_ROUNDS)][n1, n2])
        if votes == 0:
            return 0
        share = (n1 + n2 + 1.0) / (num_samples + 1.0) if num_samples else self.top_two_share
        return math.ceil(votes / max(share, _MIN_SHARE))

    def expected_votes(self, log_price: float, rounds: int) -> float:
        """Top-two votes a new question is expected to take at ``log_price`` in ``rounds``."""
        tables = self._programme().tables(log_price, rounds)
        return float(tables.spends[min(rounds, _MAX_ROUNDS)][0, 0])

    def log_price_for(self, budget_per_question: float, rounds: int) -> float:
        """The log price at which a new question is expected to take ``budget_per_question``
        samples (bisection over the price buckets): where a stream's pacing starts."""
        target = budget_per_question * self.top_two_share
        low, high = round(_MIN_LOG_PRICE / _STEP), round(_MAX_LOG_PRICE / _STEP)
        while high - low > 1:
            middle = (low + high) // 2
            if self.expected_votes(middle * _STEP, rounds) > target:
                low = middle
            else:
                high = middle
        return high * _STEP

    def settled(self, n1: int, n2: int, log_price: float) -> bool:
        """Whether no further vote is worth its price for a question with these votes."""
        return self.wave(n1, n2, n1 + n2, log_price, 1) == 0


@lru_cache(maxsize=256)
def start_log_price(budget_per_question: float, rounds: int) -> float:
    """Where a stream's pacing starts: :meth:`VotePrior.log_price_for` of a prior that has
    seen no question (the same for every stream, so computed once per budget)."""
    return VotePrior().log_price_for(budget_per_question, rounds)
