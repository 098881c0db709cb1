"""A few large waves instead of many small steps: how many samples each question gets next.

An engine runs a request of ``n`` samples in about the time of one, up to its capacity,
so what the caller waits for is a question's rounds, not its samples. Every question gets
a first wave (:meth:`WavePlan.first_wave`); later ones are sized from the votes so far (a
batch's by :meth:`WavePlan.allocate`, a stream's at its paced price), a wave that is not
a question's last sending a share of its need (:meth:`WavePlan.step`), within
``max_rounds``. See docs/decisions.md. Pure and vectorised.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from functools import lru_cache

import numpy as np
from numpy.typing import NDArray
from scipy import special

from blendserve.core.flatness import PROBE

__all__ = [
    "DEFAULT_FIRST_SHARE",
    "DEFAULT_MAX_ROUNDS",
    "FEW_ROUNDS_FIRST_SHARE",
    "MIN_REACH",
    "WIDE_GROWTH",
    "WIDE_MAX_ROUNDS",
    "WavePlan",
    "expected_log_uncertainty",
    "expected_need",
    "unanimous_need",
]

#: Rounds (engine requests one after another) a question gets at most, by default.
DEFAULT_MAX_ROUNDS = 4
#: Rounds at most, and how much a wave may grow a question's samples, in a wide plan
#: (:meth:`WavePlan.widened`).
WIDE_MAX_ROUNDS = 3
WIDE_GROWTH = 2.0
#: A question's samples may grow at least this many times over its first wave in its
#: rounds, whatever ``max_rounds``: what three rounds that double allow.
MIN_REACH = 4.0
#: The first wave's share of the mean budget per question, by default.
DEFAULT_FIRST_SHARE = 0.35
#: The share with fewer rounds than :data:`DEFAULT_MAX_ROUNDS` (2 or 3): a question's
#: last wave is then planned on fewer votes, so the first wave buys more of them.
FEW_ROUNDS_FIRST_SHARE = 0.5

# The shares p1, p2 are estimated with this many pseudo-votes each (a
# unanimous question is not taken as certain).
_PSEUDO = 0.5
# A row of expected uncertainties covers at most this many further samples.
_MAX_ROW = 1024


@lru_cache(maxsize=1 << 14)
def _row(n1: int, n2: int, num_samples: int, length: int) -> NDArray[np.float64]:
    """Expected log ASC uncertainty after ``j = 0 .. length - 1`` further samples."""
    total = num_samples + 2 * _PSEUDO
    p1 = (n1 + _PSEUDO) / total
    p2 = (n2 + _PSEUDO) / total
    j = np.arange(length, dtype=np.float64)
    with np.errstate(divide="ignore"):
        row = np.log(special.betainc(n1 + 1.0 + j * p1, n2 + 1.0 + j * p2, 0.5))
    row = np.minimum.accumulate(row)
    row.flags.writeable = False
    return row


def expected_log_uncertainty(n1: int, n2: int, num_samples: int, further: int) -> float:
    """Log ASC ``P[p1 < p2]`` expected after ``further`` more samples, at the estimated shares."""
    return float(_row(n1, n2, num_samples, further + 1)[further])


def expected_need(n1: int, n2: int, num_samples: int, log_price: float, limit: int) -> int:
    """Further samples after which ASC's uncertainty is expected at most ``log_price`` (at most
    ``limit``)."""
    return _need(_row(n1, n2, num_samples, max(1, min(limit, _MAX_ROW))), log_price)


def _need(row: NDArray[np.float64], log_price: float) -> int:
    """Further samples after which the expected uncertainty is at most ``log_price``."""
    return int(np.count_nonzero(row > log_price))


def unanimous_need(n1: int, n2: int, log_price: float, limit: int) -> int:
    """Further samples after which the question *could* be at ``log_price`` (all for the
    leader; at most ``limit``)."""
    j = np.arange(limit, dtype=np.float64)
    with np.errstate(divide="ignore"):
        row = np.log(special.betainc(n1 + 1.0 + j, n2 + 1.0, 0.5))
    return int(np.count_nonzero(row > log_price))


@dataclass(frozen=True)
class WavePlan:
    """How a question's samples are split into at most ``max_rounds`` waves, its last
    sending all it is expected to need.

    ``first_share``: the first wave's share of the mean budget per question (at least
    :data:`~blendserve.core.flatness.PROBE` samples, so the batch's flatness is known
    after it; None: by the rounds, :attr:`wave_first_share`). A wave that is not the last
    sends ``step_share`` of the need, and adds at most ``growth`` times the samples a
    question has (1: it at most doubles them; raised by :attr:`wave_growth`).
    """

    max_rounds: int = DEFAULT_MAX_ROUNDS
    first_share: float | None = None
    step_share: float = 0.5
    growth: float = 1.0

    def __post_init__(self) -> None:
        if self.max_rounds < 1:
            raise ValueError(f"max_rounds must be at least 1, got {self.max_rounds}")
        if not 0.0 < self.wave_first_share <= 1.0 or not 0.0 < self.step_share <= 1.0:
            raise ValueError("first_share and step_share must be in (0, 1]")

    @property
    def wave_first_share(self) -> float:
        """The first wave's share of the budget: :attr:`first_share`, else by the rounds (with
        two or three, half: the last wave is planned on the first's votes, or nearly)."""
        if self.first_share is not None:
            return self.first_share
        if 1 < self.max_rounds < DEFAULT_MAX_ROUNDS:
            return FEW_ROUNDS_FIRST_SHARE
        return DEFAULT_FIRST_SHARE

    @property
    def wave_growth(self) -> float:
        """The growth a wave is held to: :attr:`growth`, or more where the plan has too
        few rounds for a question to reach :data:`MIN_REACH` times its first wave
        (with two rounds, doubling would leave a third of a batch's budget unspent)."""
        if self.max_rounds < 2:
            return self.growth
        return max(self.growth, float(MIN_REACH ** (1.0 / (self.max_rounds - 1))) - 1.0)

    def widened(self) -> WavePlan:
        """This plan for an engine with room for half the job at once: at most
        :data:`WIDE_MAX_ROUNDS` rounds, each later wave up to tripling a question's samples
        (quadrupling with two rounds: :attr:`wave_growth`).

        There a round costs a straggler's whole length at a nearly free width: fewer, larger
        waves end the job sooner, and the growth lets contested questions still take the
        budget. The first wave stays the plan's (docs/benchmarks.md, "Waves").
        """
        return replace(
            self,
            max_rounds=min(self.max_rounds, WIDE_MAX_ROUNDS),
            growth=WIDE_GROWTH,
            first_share=self.wave_first_share,
        )

    def first_wave(self, budget_per_question: float) -> int:
        """Samples of every question's first wave (all of them with one round only)."""
        if self.max_rounds == 1:
            return max(1, math.floor(budget_per_question))
        wave = max(PROBE, round(self.wave_first_share * budget_per_question))
        return max(1, min(wave, math.floor(budget_per_question)))

    def wave(
        self,
        n1: int,
        n2: int,
        num_samples: int,
        log_price: float,
        *,
        limit: int,
        rounds_left: int,
    ) -> int:
        """Samples to send next for one question of a stream (0: done), paced at ``log_price``
        on ASC's log uncertainty: ``num_samples`` counts abstentions, ``limit`` is what its
        cap leaves, ``rounds_left`` counts this wave."""
        if limit <= 0 or rounds_left <= 0:
            return 0
        need = _need(_row(n1, n2, num_samples, min(limit, _MAX_ROW)), log_price)
        # A stream's price is paced: a last wave of all a contested question is
        # expected to need would take samples the pacing then takes from others.
        grown = max(1, math.ceil(self.wave_growth * num_samples))
        return min(grown, self.step(need, n1, n2, num_samples, log_price, rounds_left))

    def allocate(
        self,
        states: Sequence[tuple[int, int, int]],
        pending: Sequence[int],
        limits: Sequence[int],
        floors: Sequence[int],
        budget: int,
        log_stop: float = -math.inf,
        rows: Sequence[NDArray[np.float64]] | None = None,
    ) -> tuple[list[int], float]:
        """Splits a batch's remaining ``budget`` (samples not yet dispatched) between its open
        questions, each given as ``states`` ``(n1, n2, samples observed)``, samples
        ``pending`` in flight, ``limits`` (further samples beyond those observed: its cap
        left) and ``floors`` (further samples it gets first, whatever its votes).

        The budget goes to the further samples worth most by ``rows`` (non-increasing; None:
        ASC's expected log uncertainty after each), none to a question expected to be at
        most ``log_stop`` uncertain already (the budget is a ceiling). Returns each
        question's expected need beyond its samples in flight, and the log price, in the
        rows' unit, at which the budget runs out (``log_stop`` when it does not).
        """
        floor_need = [
            max(0, min(f, lim) - p) for f, p, lim in zip(floors, pending, limits, strict=True)
        ]
        left = budget - sum(floor_need)
        if rows is None:
            rows = [
                _row(n1, n2, n, max(1, min(lim, _MAX_ROW)))
                for (n1, n2, n), lim in zip(states, limits, strict=True)
            ]
        starts = [min(p + f, lim) for p, f, lim in zip(pending, floor_need, limits, strict=True)]
        log_price = log_stop
        if left > 0:
            slots = [row[s:lim] for row, s, lim in zip(rows, starts, limits, strict=True)]
            values = np.concatenate(slots) if slots else np.zeros(0)
            values = values[values > log_stop]
            if values.size > left:
                log_price = float(-np.partition(-values, left)[left])
        else:
            log_price = math.inf
        needs = []
        for row, s, f, lim in zip(rows, starts, floor_need, limits, strict=True):
            extra = int(np.count_nonzero(row[s:lim] > log_price))
            needs.append(f + extra)
        return needs, log_price

    def reach(self, num_samples: int, rounds_left: int) -> int:
        """Samples a question holding ``num_samples`` can reach in ``rounds_left`` waves."""
        return math.ceil(max(1, num_samples) * (1.0 + self.wave_growth) ** max(0, rounds_left))

    def step(
        self,
        need: int,
        n1: int,
        n2: int,
        num_samples: int,
        log_price: float,
        rounds_left: int,
        unanimous: int | None = None,
    ) -> int:
        """The wave sent of ``need``: all of it in a question's last round, else a share of it
        (at least ``unanimous``, what a unanimous question would need to reach ``log_price``;
        None: by ASC's uncertainty)."""
        if need <= 0:
            return 0
        grown = max(1, math.ceil(self.wave_growth * num_samples))
        if rounds_left <= 1:
            return need
        share = max(1, math.ceil(self.step_share * need))
        if unanimous is None:
            unanimous = unanimous_need(n1, n2, log_price, need)
        return min(need, max(min(share, grown), unanimous))
