"""A stream's waves: the Bayes-optimal ones under its learned prior, at a price per vote.

A dynamic programme over the vote state ``(n1, n2)`` and the rounds left, under the
stream's :class:`~blendserve.core.prior.SharePrior`: each round stops, at the posterior
chance that the leader is not the mode, or buys ``w`` more top-two votes at the price each
(paced by :class:`~blendserve.core.price.PacedPrice`). A wave of ``w`` votes is sent as
``w`` divided by the question's (else the stream's) share of top-two votes.

Building takes long (docs/openai.md, "Online self-consistency"): :meth:`VotePrior.wave`
builds what it needs; a caller that must not wait (the pools' event loop) asks
:meth:`VotePrior.ready`, which builds nothing, decides with :meth:`VotePrior.fallback`
while the prior's own programme is missing, and has the rest built elsewhere
(:meth:`Need.build`). Builds never run two at a time; lookups may run beside one.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field
from functools import lru_cache

import numpy as np
from numpy.typing import NDArray
from scipy import special, stats

from blendserve.core.prior import SHARES, SharePrior

__all__ = [
    "Need",
    "ReadyPrior",
    "VotePrior",
    "start_log_price",
    "start_log_price_known",
]

# Wave sizes the programme chooses among (top-two votes).
_SIZES = (1, 2, 3, 4, 5, 6, 7, 8, 10, 12, 14, 16, 20, 24, 28, 32, 40, 48, 56, 64)
# Log-price buckets: tables are computed once per bucket.
_STEP = 0.1
# A wave is sized for a top-two share of at least this.
_MIN_SHARE = 0.2
# log_price_for searches between these.
_MIN_LOG_PRICE = -16.0
_MAX_LOG_PRICE = 0.0
# More rounds left than this are planned as this many.
_MAX_ROUNDS = 8
# Price buckets whose tables a programme keeps, and the bytes of the programmes kept
# in memory (enough for some tens of programmes at 64 votes, docs/benchmarks.md,
# "Figures behind constants"; streams whose priors are alike share one).
_MAX_TABLES = 16
_PROGRAMME_BYTES = 256 << 20
# Start prices kept (one per budget and rounds).
_MAX_START_PRICES = 256
# Grid weights are rounded to this many decimals to name a programme.
_DECIMALS = 4


# Stamps what was used last, so that the least recently used goes first.
_CLOCK = itertools.count()


def _bucket(log_price: float) -> int:
    """The price bucket whose tables decide at ``log_price``."""
    return round(log_price / _STEP)


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
    used: int = 0

    def __post_init__(self) -> None:
        self.waves.append(np.zeros(self.value.shape, dtype=np.uint8))
        self.spends.append(np.zeros(self.value.shape))

    def covers(self, rounds: int) -> bool:
        """Whether the tables hold ``rounds`` rounds left (at most 8)."""
        # spends grow before waves: a round whose wave is listed is whole.
        return len(self.waves) > min(rounds, _MAX_ROUNDS)

    @property
    def nbytes(self) -> int:
        """Bytes of the tables' arrays."""
        arrays: list[NDArray[np.generic]] = [self.value, *list(self.waves), *list(self.spends)]
        return sum(int(a.nbytes) for a in arrays)


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
        # Only builds change the dict; lookups read it (and stamp what they use).
        self._tables: dict[int, _Tables] = {}
        self.used = next(_CLOCK)

    @property
    def nbytes(self) -> int:
        """Bytes of the programme, its tables included."""
        fixed = int(self.error.nbytes) + sum(int(p.nbytes) for p in self._predictive.values())
        return fixed + sum(t.nbytes for t in list(self._tables.values()))

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

    def built(self, bucket: int, rounds: int) -> _Tables | None:
        """The tables of ``bucket`` if they cover ``rounds`` rounds left (None: not yet).

        Builds nothing: safe beside a build of another thread.
        """
        tables = self._tables.get(bucket)
        if tables is None or not tables.covers(rounds):
            return None
        tables.used = self.used = next(_CLOCK)
        return tables

    def tables(self, log_price: float, rounds_left: int) -> _Tables:
        """The tables at ``log_price``'s bucket, covering ``rounds_left`` (at most 8) rounds."""
        bucket = _bucket(log_price)
        tables = self._tables.get(bucket)
        if tables is None:
            tables = _Tables(bucket * _STEP, self.error.copy())
            self._extend(tables, min(rounds_left, _MAX_ROUNDS))
            tables.used = next(_CLOCK)
            self._tables[bucket] = tables  # listed once whole
            while len(self._tables) > _MAX_TABLES:
                oldest = min(self._tables, key=lambda b: self._tables[b].used)
                del self._tables[oldest]
        elif not tables.covers(rounds_left):
            self._extend(tables, min(rounds_left, _MAX_ROUNDS))
        tables.used = self.used = next(_CLOCK)
        return tables


# A programme's name: the rounded weights of its prior, and its max_votes.
_Key = tuple[tuple[float, ...], int]


class _Programmes:
    """The programmes built, kept while their bytes fit ``budget``: the least recently
    used go first, but never the programme of a prior that has seen nothing (every new
    stream's, and what decides while a stream's own is built)."""

    def __init__(self, budget: int = _PROGRAMME_BYTES) -> None:
        self.budget = budget
        self._kept: dict[_Key, _Programme] = {}

    def built(self, key: _Key) -> _Programme | None:
        """The programme of ``key`` if it is built (None: not); builds nothing."""
        programme = self._kept.get(key)
        if programme is not None:
            programme.used = next(_CLOCK)
        return programme

    def get(self, key: _Key) -> _Programme:
        """The programme of ``key``, built if missing."""
        programme = self.built(key)
        if programme is None:
            programme = self._kept[key] = _Programme(np.asarray(key[0]), key[1])
        return programme

    @property
    def nbytes(self) -> int:
        """Bytes of every programme kept."""
        return sum(p.nbytes for p in list(self._kept.values()))

    def trim(self) -> None:
        """Drops the least recently used programmes until the rest fit the budget."""
        total = self.nbytes
        while total > self.budget:
            evictable = [k for k in self._kept if k[0] != _UNIFORM]
            if not evictable:
                return
            oldest = min(evictable, key=lambda k: self._kept[k].used)
            total -= self._kept.pop(oldest).nbytes


_PROGRAMMES = _Programmes()


def _programme(weights: tuple[float, ...], max_votes: int) -> _Programme:
    """The programme of ``weights`` (built if missing, then the cache trimmed)."""
    key = (weights, max_votes)
    programme = _PROGRAMMES.built(key)
    if programme is None:
        programme = _PROGRAMMES.get(key)
        _PROGRAMMES.trim()
    return programme


def _tables(key: _Key, bucket: int, rounds: int) -> _Tables:
    """The tables of ``key``'s programme at ``bucket``, built if missing."""
    programme = _PROGRAMMES.built(key)
    tables = programme.built(bucket, rounds) if programme is not None else None
    if tables is None:
        tables = _programme(*key).tables(bucket * _STEP, rounds)
        _PROGRAMMES.trim()
    return tables


def _built(key: _Key | None, bucket: int, rounds: int) -> _Tables | None:
    """The tables of ``key``'s programme at ``bucket`` if built (None: not); builds nothing."""
    programme = _PROGRAMMES.built(key) if key is not None else None
    return programme.built(bucket, rounds) if programme is not None else None


@dataclass(frozen=True)
class Need:
    """What a decision at one price needs built: a programme and its tables at a bucket.
    Equal needs are one build, so a builder may run each once however many ask for it."""

    key: _Key
    bucket: int
    rounds: int

    def build(self) -> None:
        """Builds what is missing; never two at a time, lookups may run beside it."""
        _tables(self.key, self.bucket, self.rounds)


class ReadyPrior:
    """A prior's waves at one price from tables already built: it decides without building.

    It reads the prior's own programme wherever built, else the tables it was made with
    (of the prior before its last refit, or of one that has seen nothing).
    """

    def __init__(self, prior: VotePrior, tables: _Tables, rounds: int) -> None:
        self.prior = prior
        self.bucket = _bucket(tables.log_price)
        self.rounds = rounds
        self._tables = tables

    def _at(self, log_price: float, rounds: int) -> _Tables:
        if _bucket(log_price) != self.bucket or rounds > self.rounds:
            raise ValueError(
                f"built for the price {self.bucket * _STEP:g} and {self.rounds} rounds"
            )
        own = self.prior._built(self.bucket, rounds)
        return own if own is not None else self._tables

    def wave(self, n1: int, n2: int, num_samples: int, log_price: float, rounds_left: int) -> int:
        """As :meth:`VotePrior.wave`, at the price and rounds this was made for (at most)."""
        if rounds_left <= 0:
            return 0
        return self.prior._wave(self._at(log_price, rounds_left), n1, n2, num_samples, rounds_left)

    def settled(self, n1: int, n2: int, log_price: float) -> bool:
        """As :meth:`VotePrior.settled`."""
        return self.wave(n1, n2, n1 + n2, log_price, 1) == 0


class VotePrior(SharePrior):
    """A stream's learned prior (:class:`~blendserve.core.prior.SharePrior`) and the waves it
    implies, for at most ``max_votes`` top-two votes a question."""

    def __init__(self, *, max_votes: int = 64, refit_every: int = 50, history: int = 1000) -> None:
        if not 1 <= max_votes <= 255:
            raise ValueError("max_votes must be in [1, 255]")
        super().__init__(refit_every=refit_every, history=history)
        self.max_votes = max_votes
        self._key = self.key(_DECIMALS)
        self._previous: tuple[float, ...] | None = None  # the key before the last refit

    def fit(self, votes: NDArray[np.float64] | None = None) -> None:
        """Refits the weights (see :meth:`SharePrior.fit`); the programme follows them."""
        super().fit(votes)
        key = self.key(_DECIMALS)
        if key != self._key:
            self._previous, self._key = self._key, key

    def _programme(self) -> _Programme:
        return _programme(self._key, self.max_votes)

    def _built(self, bucket: int, rounds: int) -> _Tables | None:
        return _built((self._key, self.max_votes), bucket, rounds)

    def need(self, log_price: float, rounds: int) -> Need:
        """What :meth:`ready` at ``log_price`` for ``rounds`` rounds left needs built."""
        return Need((self._key, self.max_votes), _bucket(log_price), max(1, rounds))

    def fallback_need(self, log_price: float, rounds: int) -> Need:
        """What :meth:`fallback` needs built when nothing it reads is: the tables of a
        prior that has seen nothing (whose programme is kept once built)."""
        return Need((_UNIFORM, self.max_votes), _bucket(log_price), max(1, rounds))

    @property
    def programme_built(self) -> bool:
        """Whether this prior's programme is built (its tables at a new price may not be)."""
        return _PROGRAMMES.built((self._key, self.max_votes)) is not None

    def ready(self, log_price: float, rounds: int) -> ReadyPrior | None:
        """This prior's waves at ``log_price`` for up to ``rounds`` rounds left, if built
        (None: :meth:`need` is not built). Builds nothing."""
        rounds = max(1, rounds)
        tables = self._built(_bucket(log_price), rounds)
        return ReadyPrior(self, tables, rounds) if tables is not None else None

    def fallback(self, log_price: float, rounds: int) -> ReadyPrior | None:
        """Waves to decide with while this prior's programme is built: from the
        programme of the prior before its last refit, else of a prior that has seen
        nothing, whichever is built (None: neither). Builds nothing."""
        rounds, bucket = max(1, rounds), _bucket(log_price)
        for weights in (self._previous, _UNIFORM):
            key = (weights, self.max_votes) if weights is not None else None
            tables = _built(key, bucket, rounds)
            if tables is not None:
                return ReadyPrior(self, tables, rounds)
        return None

    def _wave(self, tables: _Tables, n1: int, n2: int, num_samples: int, rounds_left: int) -> int:
        n1, n2 = min(n1, self.max_votes), min(n2, self.max_votes)
        votes = int(tables.waves[min(rounds_left, _MAX_ROUNDS)][n1, n2])
        if votes == 0:
            return 0
        share = (n1 + n2 + 1.0) / (num_samples + 1.0) if num_samples else self.top_two_share
        return math.ceil(votes / max(share, _MIN_SHARE))

    def wave(self, n1: int, n2: int, num_samples: int, log_price: float, rounds_left: int) -> int:
        """Samples to send next for a question with these votes (0: it stops): ``num_samples``
        counts other answers and abstentions, ``log_price`` is the log price of a top-two
        vote (in units of error), ``rounds_left`` counts this wave."""
        if rounds_left <= 0:
            return 0
        tables = _tables((self._key, self.max_votes), _bucket(log_price), rounds_left)
        return self._wave(tables, n1, n2, num_samples, rounds_left)

    def expected_votes(self, log_price: float, rounds: int) -> float:
        """Top-two votes a new question is expected to take at ``log_price`` in ``rounds``."""
        tables = _tables((self._key, self.max_votes), _bucket(log_price), rounds)
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

    def past_horizon(self, n1: int, n2: int, log_price: float, limit: int) -> bool:
        """Whether a last wave the programme has no room for (past ``max_votes``, of at most
        ``limit`` votes, what the cap leaves) would have been worth its price at these votes:
        a question :meth:`settled` there stopped at the programme's horizon, not its price.
        Exact for one more wave, in float64 (the tables are float32); builds nothing."""
        room = self.max_votes - n1 - n2
        sizes = [w for w in _SIZES if room < w <= limit]
        if not sizes:
            return False
        price = math.exp(_bucket(log_price) * _STEP)
        log_x, log_y = np.log(SHARES), np.log1p(-SHARES)
        log_w = np.log(np.asarray(self._key))
        # The first (second) answer is the mode with the leader's share x.
        first = log_w + n1 * log_x + n2 * log_y
        second = log_w + n2 * log_x + n1 * log_y
        top = max(first.max(), second.max())
        total = np.exp(first - top).sum() + np.exp(second - top).sum()
        error = min(np.exp(first - top).sum(), np.exp(second - top).sum()) / total
        for w in sizes:
            j = np.arange(w + 1)[:, None]
            # j of w more votes for the first answer, and which answer is the mode.
            stays = np.exp(first + j * log_x + (w - j) * log_y - top).sum(axis=1)
            turns = np.exp(second + (w - j) * log_x + j * log_y - top).sum(axis=1)
            expected = float((special.comb(w, j[:, 0]) * np.minimum(stays, turns)).sum() / total)
            if price * w + expected < error:
                return True
        return False


#: The name of a prior that has seen nothing: a new stream's.
_UNIFORM = VotePrior()._key

# (budget, rounds) -> start log price; only a computing caller adds to it.
_START_PRICES: dict[tuple[float, int], float] = {}


def start_log_price(budget_per_question: float, rounds: int) -> float:
    """Where a stream's pacing starts: :meth:`VotePrior.log_price_for` of a prior that has
    seen no question (the same for every stream, so computed once per budget)."""
    known = _START_PRICES.get((budget_per_question, rounds))
    if known is not None:
        return known
    price = VotePrior().log_price_for(budget_per_question, rounds)
    while len(_START_PRICES) >= _MAX_START_PRICES:
        del _START_PRICES[next(iter(_START_PRICES))]
    _START_PRICES[(budget_per_question, rounds)] = price
    return price


def start_log_price_known(budget_per_question: float, rounds: int) -> bool:
    """Whether :func:`start_log_price` of these is computed already (it then builds nothing)."""
    return (budget_per_question, rounds) in _START_PRICES
