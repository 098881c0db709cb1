"""When one question of a stream has enough samples, and how many it asks for next.

A stream of single questions gets a batch's saving by stopping each question
once its next votes are worth less than the price (:mod:`~blendserve.core.price`):
its uncertainty (ASC's ``P[p1 < p2]`` or PPR-1v1's) is at most the price, or,
with a learned prior, the prior's programme stops it
(:mod:`~blendserve.core.programme`).

Samples may be requested in waves: :meth:`StoppingRule.samples_to_stop` is
the least number of further samples after which the question *could* stop
(every one of them voting for the leader). Any other outcome of those samples
leaves it less sure, so no stopping point lies inside a wave and waves of that
size stop every question at exactly the sample a one-at-a-time loop would.
Only the first wave is larger, a share of the budget (:meth:`StoppingRule.for_budget`).
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
    """When one question has enough samples.

    A question stops once its uncertainty is at most the price or it holds
    ``max_num_samples`` samples.

    Attributes:
        score: ``asc`` (``P[p1 < p2]``) or ``ppr`` (PPR-1v1's density ratio).
        max_num_samples: the cap per question.
        min_growth: waves are at least this share of the samples a question
            has (0: waves stop exactly where one-at-a-time sampling would).
        min_first: the first wave is at least this many samples.
        max_rounds: waves per question at most (0: no bound); later waves are
            then sized by :class:`~blendserve.core.waves.WavePlan` from what the
            question is expected to need, and its last wave takes all of it.
        prior: the stream's learned :class:`~blendserve.core.programme.VotePrior`
            (or its :class:`~blendserve.core.programme.ReadyPrior` at one price,
            which builds nothing), which then sizes every wave instead (``asc``
            with ``max_rounds`` only), and the price is that of a top-two vote.
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
        """The rule for a mean budget: capped at ``cap`` times it, and ``max_extra`` beyond it.

        The second bound matters at large budgets on flat answer distributions
        (many near-tied answers), where samples past it bought little on the
        recorded sets. The first wave is at least ``first_share`` of the
        budget: at large budgets that saves rounds, and a question is not
        stopped by a lucky unanimous start, which matters most on flat data
        (docs/benchmarks.md, "Figures behind constants").
        """
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
        samples vote (at worst: all for the runner-up, each a new answer).

        Its wave may then be cut before those samples end: the wave's end could
        undo neither the stop nor the answer. Stopping on fewer samples than the
        wave whenever the votes so far allow would test the threshold after
        every sample instead of every wave, and stop questions on too few votes.
        """
        n2 += running
        return n1 > n2 and self.is_done(n1, n2, num_distinct + running, 0, log_price)

    def samples_to_stop(
        self, n1: int, n2: int, num_distinct: int, num_samples: int, log_price: float
    ) -> int:
        """Least further samples after which the question could stop (0: it stops now).

        Counts as if each further sample voted for the leader, the only
        outcome that lowers the uncertainty fastest, so the question cannot
        stop before that many; never more than the cap leaves.
        """
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
        never 0 before its first sample).

        :meth:`samples_to_stop`, raised to ``min_growth`` times the samples it
        has, so a contested question needs few rounds (at the price of a few
        samples a one-at-a-time loop would not have spent); with
        ``max_rounds``, raised to the wave plan's step of what the question
        is expected to need, and 0 once it has had ``max_rounds`` waves.
        """
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
