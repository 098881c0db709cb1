"""When one question of a stream has enough samples, and how many it asks for next.

A question stops once its next votes are worth less than the price
(:mod:`~blendserve.core.price`): its uncertainty (ASC's ``P[p1 < p2]`` or PPR-1v1's) is at
most the price, or, with a learned prior, the prior's programme stops it
(:mod:`~blendserve.core.programme`). :meth:`StoppingRule.samples_to_stop` is the least
number of further samples after which it *could* stop (all for the leader); any other
outcome leaves it less sure, so no stopping point lies inside a wave of that size, and
such waves stop every question at exactly the sample a one-at-a-time loop would. Only the
first wave is larger, a share of the budget (:meth:`StoppingRule.for_budget`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal

from blendserve.core.programme import ReadyPrior, VotePrior
from blendserve.core.uncertainty import asc_log_uncertainty, ppr_log_uncertainty
from blendserve.core.waves import WavePlan

__all__ = [
    "DEFAULT_CAP",
    "SCORES",
    "Score",
    "StoppingRule",
]

#: A question's cap, as a multiple of the mean budget (see StoppingRule.for_budget).
DEFAULT_CAP = 16.0

#: Uncertainty scores a stopping rule may threshold.
SCORES = ("asc", "ppr")
Score = Literal["asc", "ppr"]


@dataclass(frozen=True)
class StoppingRule:
    """When one question has enough samples: its uncertainty (``score``: ``asc``,
    ``P[p1 < p2]``, or ``ppr``, PPR-1v1's density ratio) is at most the price, or it holds
    ``max_num_samples``.

    Waves are at least ``min_growth`` times the samples a question has (0: they stop
    exactly where one-at-a-time sampling would), the first at least ``min_first``. With
    ``max_rounds`` (0: no bound) later waves are sized by
    :class:`~blendserve.core.waves.WavePlan` from what the question is expected to need,
    its last taking all of it. A ``prior`` (the stream's
    :class:`~blendserve.core.programme.VotePrior`, or its
    :class:`~blendserve.core.programme.ReadyPrior` at one price, which builds nothing)
    sizes every wave instead (``asc`` with ``max_rounds`` only), at a price per top-two vote.
    """

    score: Score = "asc"
    max_num_samples: int = 64
    min_growth: float = 0.0
    min_first: int = 0
    max_rounds: int = 0
    prior: VotePrior | ReadyPrior | None = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        if self.score not in SCORES:
            raise ValueError(f"unknown score {self.score!r} (known: {', '.join(SCORES)})")
        if self.max_num_samples < 1:
            raise ValueError(f"max_num_samples must be at least 1, got {self.max_num_samples}")
        if not self.min_growth >= 0.0:
            raise ValueError(f"min_growth must be >= 0, got {self.min_growth}")
        if self.min_first < 0:
            raise ValueError(f"min_first must be >= 0, got {self.min_first}")
        if self.max_rounds < 0:
            raise ValueError(f"max_rounds must be >= 0, got {self.max_rounds}")
        if self.prior is not None and not (self.max_rounds and self.score == "asc"):
            raise ValueError("a prior plans bounded waves of the asc score only")

    @classmethod
    def for_budget(
        cls,
        budget_per_question: float,
        *,
        score: Score = "asc",
        cap: float = DEFAULT_CAP,
        max_extra: float = 48.0,
        min_growth: float = 0.0,
        first_share: float = 0.5,
        max_rounds: int = 0,
        prior: VotePrior | None = None,
    ) -> StoppingRule:
        """The rule for a mean budget: capped at ``cap`` times it, and ``max_extra`` beyond it
        (past which samples buy little on flat answer distributions). The first wave is at
        least ``first_share`` of the budget: at large budgets that saves rounds, and a lucky
        unanimous start does not stop a question, which matters most on flat data
        (docs/benchmarks.md, "Figures behind constants")."""
        limit = min(cap * budget_per_question, budget_per_question + max_extra)
        cap_samples = max(1, round(limit))
        min_first = min(cap_samples, math.floor(first_share * budget_per_question))
        return cls(score, cap_samples, min_growth, max(0, min_first), max_rounds, prior)

    def log_uncertainty(self, n1: int, n2: int, num_distinct: int) -> float:
        """Log of the rule's uncertainty of vote state ``(n1, n2, K)``; larger is less sure."""
        if self.score == "asc":
            return asc_log_uncertainty(n1, n2)
        return ppr_log_uncertainty(n1, n2, num_distinct)

    def is_done(
        self, n1: int, n2: int, num_distinct: int, num_samples: int, log_price: float
    ) -> bool:
        """Whether a question with these votes and samples stops at the price."""
        if num_samples >= self.max_num_samples:
            return True
        if self.prior is not None:
            return n1 > 0 and self.prior.settled(n1, n2, log_price)
        return n1 > 0 and self.log_uncertainty(n1, n2, num_distinct) <= log_price

    def is_done_whatever_comes(
        self, n1: int, n2: int, num_distinct: int, running: int, log_price: float
    ) -> bool:
        """Whether a question stops at the price with its leader however its ``running``
        samples vote (at worst: all for the runner-up, each a new answer): its wave may then
        be cut, as its end could undo neither the stop nor the answer. (Stopping whenever
        the votes so far allow would test the threshold after every sample, not every wave,
        and stop questions on too few votes.)"""
        n2 += running
        return n1 > n2 and self.is_done(n1, n2, num_distinct + running, 0, log_price)

    def samples_to_stop(
        self, n1: int, n2: int, num_distinct: int, num_samples: int, log_price: float
    ) -> int:
        """Least further samples after which the question could stop (0: it stops now): each
        voting for the leader, the outcome that lowers the uncertainty fastest; never more
        than the cap leaves."""
        if self.is_done(n1, n2, num_distinct, num_samples, log_price):
            return 0
        left = self.max_num_samples - num_samples
        distinct = max(1, num_distinct)
        for m in range(1, left):
            if self.log_uncertainty(n1 + m, n2, distinct) <= log_price:
                return m
        return left

    def wave_size(
        self,
        n1: int,
        n2: int,
        num_distinct: int,
        num_samples: int,
        log_price: float,
        rounds: int = 0,
    ) -> int:
        """Samples to request next for one question that has had ``rounds`` waves (0: done;
        never 0 before its first sample): :meth:`samples_to_stop`, raised to ``min_growth``
        times the samples it has (few rounds for a contested question, for a few samples a
        one-at-a-time loop would not spend); with ``max_rounds``, raised to the wave plan's
        step of what it is expected to need, and 0 once it has had ``max_rounds`` waves."""
        if self.max_rounds and rounds >= self.max_rounds:
            return 0
        left = self.max_num_samples - num_samples
        if self.prior is not None:
            rounds_left = self.max_rounds - rounds
            wave = self.prior.wave(n1, n2, num_samples, log_price, rounds_left)
            # At a price past a vote's worth the programme would answer with no sample.
            return max(0 if num_samples else 1, min(left, wave))
        need = self.samples_to_stop(n1, n2, num_distinct, num_samples, log_price)
        if need == 0:
            return 0
        grown = math.ceil(self.min_growth * num_samples) if num_samples else self.min_first
        if self.max_rounds and num_samples and self.score == "asc":
            plan = WavePlan(max_rounds=self.max_rounds)
            rounds_left = self.max_rounds - rounds
            grown = max(
                grown,
                plan.wave(n1, n2, num_samples, log_price, limit=left, rounds_left=rounds_left),
            )
        return min(left, max(need, grown))
