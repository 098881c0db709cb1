"""Online self-consistency: stop each question at an uncertainty threshold paced to a budget.

Over a batch, the budget-constrained optimum is a threshold on each
question's uncertainty (the threshold is the budget's Lagrange multiplier).
A stream of single questions gets the same saving by stopping each question
once its uncertainty is at most ``tau`` and learning ``tau`` online so that
the running mean samples per question matches the budget asked for.

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

from blendserve.core.uncertainty import asc_log_uncertainty, ppr_log_uncertainty
from blendserve.core.vote_prior import ReadyPrior, VotePrior
from blendserve.core.waves import WavePlan

__all__ = [
    "DEFAULT_CAP",
    "SCORES",
    "PacedThreshold",
    "Score",
    "StoppingRule",
    "start_log_tau",
]

#: A question's cap, as a multiple of the mean budget (see StoppingRule.for_budget).
DEFAULT_CAP = 16.0

#: Uncertainty scores a stopping rule may threshold.
SCORES = ("asc", "ppr")
Score = Literal["asc", "ppr"]

# log tau stays within these (ASC is at most 0.5; PPR-1v1 is a density ratio, it
# may exceed 1: one unanimous sample scores 1).
_MIN_LOG_TAU = math.log(1e-12)
_MAX_LOG_TAU = math.log(4.0)

_LOG2 = math.log(2.0)


def start_log_tau(budget_per_question: float) -> float:
    """A cautious first ``log tau`` for a mean budget, before any question is seen.

    The ASC threshold at which a unanimous question stops after half the
    budget: derived from the rule, not fitted on any data. The pacing
    controller learns the pool's own threshold from there.
    """
    unanimous = max(1.0, budget_per_question) / 2.0
    return max(_MIN_LOG_TAU, -(unanimous + 1.0) * _LOG2)


@dataclass(frozen=True)
class StoppingRule:
    """When one question has enough samples.

    A question stops once its uncertainty is at most ``tau`` or it holds
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
        prior: the stream's learned :class:`~blendserve.core.vote_prior.VotePrior`
            (or its :class:`~blendserve.core.vote_prior.ReadyPrior` at one price,
            which builds nothing), which then sizes every wave instead (``asc``
            with ``max_rounds`` only), and ``tau`` is the price of a vote it is
            paced by.
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
        self, n1: int, n2: int, num_distinct: int, num_samples: int, log_tau: float
    ) -> bool:
        """Whether a question with these votes and samples stops at ``log tau``."""
        if num_samples >= self.max_num_samples:
            return True
        if self.prior is not None:
            return n1 > 0 and self.prior.settled(n1, n2, log_tau)
        return n1 > 0 and self.log_uncertainty(n1, n2, num_distinct) <= log_tau

    def is_done_whatever_comes(
        self, n1: int, n2: int, num_distinct: int, running: int, log_tau: float
    ) -> bool:
        """Whether a question stops at ``log tau`` with its leader however its ``running``
        samples vote (at worst: all for the runner-up, each a new answer).

        Its wave may then be cut before those samples end: the wave's end could
        undo neither the stop nor the answer. Stopping on fewer samples than the
        wave whenever the votes so far allow would test the threshold after
        every sample instead of every wave, and stop questions on too few votes.
        """
        n2 += running
        return n1 > n2 and self.is_done(n1, n2, num_distinct + running, 0, log_tau)

    def samples_to_stop(
        self, n1: int, n2: int, num_distinct: int, num_samples: int, log_tau: float
    ) -> int:
        """Least further samples after which the question could stop (0: it stops now).

        Counts as if each further sample voted for the leader, the only
        outcome that lowers the uncertainty fastest, so the question cannot
        stop before that many; never more than the cap leaves.
        """
        if self.is_done(n1, n2, num_distinct, num_samples, log_tau):
            return 0
        left = self.max_num_samples - num_samples
        distinct = max(1, num_distinct)
        for m in range(1, left):
            if self.log_uncertainty(n1 + m, n2, distinct) <= log_tau:
                return m
        return left

    def wave_size(
        self,
        n1: int,
        n2: int,
        num_distinct: int,
        num_samples: int,
        log_tau: float,
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
            wave = self.prior.wave(n1, n2, num_samples, log_tau, rounds_left)
            # At a price past a vote's worth the programme would answer with no sample.
            return max(0 if num_samples else 1, min(left, wave))
        need = self.samples_to_stop(n1, n2, num_distinct, num_samples, log_tau)
        if need == 0:
            return 0
        grown = math.ceil(self.min_growth * num_samples) if num_samples else self.min_first
        if self.max_rounds and num_samples and self.score == "asc":
            plan = WavePlan(max_rounds=self.max_rounds)
            rounds_left = self.max_rounds - rounds
            grown = max(
                grown, plan.wave(n1, n2, num_samples, log_tau, limit=left, rounds_left=rounds_left)
            )
        return min(left, max(need, grown))


class PacedThreshold:
    """Learns ``log tau`` online so that the mean samples per question meet a budget.

    Two terms: a slow estimate of the threshold whose expected spend is the
    budget (stochastic approximation: each finished question moves it by its
    excess spend times a gain, larger for the first questions so that a cold
    start converges), and a correction proportional to the debt, the samples
    spent beyond the budget so far, repaid over ``horizon`` questions. The
    debt term keeps the *running mean* on target even where spend is a step
    function of ``tau``. Open questions count in the debt as soon as they pass
    the budget (:meth:`spend`), so many questions in flight do not overshoot
    together before the first of them finishes.

    With ``budget_per_question=None`` the threshold is fixed at ``log_tau``
    (a quality target instead of a budget).

    Args:
        budget_per_question: the mean samples per question to pace to.
        log_tau: the first threshold (default: :func:`start_log_tau`).
        gain: log-tau step per sample of excess spend of one question.
        warmup: the ``n``-th finished question's step is ``gain * (1 + warmup / n)``.
        horizon: questions over which a debt is repaid.
    """

    def __init__(
        self,
        budget_per_question: float | None,
        *,
        log_tau: float | None = None,
        gain: float = 0.003,
        warmup: float = 20.0,
        horizon: float = 50.0,
    ) -> None:
        if budget_per_question is not None and not budget_per_question >= 1.0:
            raise ValueError(f"budget_per_question must be at least 1, got {budget_per_question}")
        if log_tau is None:
            if budget_per_question is None:
                raise ValueError("a fixed threshold needs log_tau")
            log_tau = start_log_tau(budget_per_question)
        if not _MIN_LOG_TAU <= log_tau <= _MAX_LOG_TAU:
            raise ValueError(f"log_tau must be in [log 1e-12, log 4], got {log_tau}")
        if not gain > 0 or not horizon > 0 or not warmup >= 0:
            raise ValueError("gain and horizon must be positive, warmup at least 0")
        self.budget_per_question = budget_per_question
        self.gain = gain
        self.warmup = warmup
        self.horizon = horizon
        self._base = log_tau
        self._open_excess = 0.0
        self.num_questions = 0
        self.num_samples = 0

    @property
    def paced(self) -> bool:
        """Whether ``tau`` follows a budget (else it is a fixed quality target)."""
        return self.budget_per_question is not None

    @property
    def debt(self) -> float:
        """Samples spent beyond the budget: by finished questions, and open ones past it."""
        if self.budget_per_question is None:
            return 0.0
        finished = self.num_samples - self.budget_per_question * self.num_questions
        return finished + self._open_excess

    @property
    def log_tau(self) -> float:
        """The threshold now, in log space."""
        if self.budget_per_question is None:
            return self._base
        # A debt of `horizon` samples raises log tau by what about one sample of a
        # unanimous question is worth (ASC halves per vote: log 2).
        correction = math.log(2.0) * self.debt / self.horizon
        return min(_MAX_LOG_TAU, max(_MIN_LOG_TAU, self._base + correction))

    @property
    def tau(self) -> float:
        """The threshold now."""
        return math.exp(self.log_tau)

    @property
    def mean_samples(self) -> float:
        """Mean samples per finished question (0 before the first)."""
        return self.num_samples / self.num_questions if self.num_questions else 0.0

    @property
    def pacing_error(self) -> float:
        """``mean_samples / budget - 1`` (0 for a fixed threshold or before any question)."""
        if self.budget_per_question is None or not self.num_questions:
            return 0.0
        return self.mean_samples / self.budget_per_question - 1.0

    def _excess(self, num_samples: int) -> float:
        if self.budget_per_question is None:
            return 0.0
        return max(0.0, num_samples - self.budget_per_question)

    def spend(self, before: int, after: int) -> None:
        """An open question went from ``before`` to ``after`` samples."""
        self._open_excess += self._excess(after) - self._excess(before)

    def close(self, num_samples: int) -> None:
        """An open question reported to :meth:`spend` with ``num_samples`` samples is no
        longer open (answered: :meth:`observe` it too; or its caller left)."""
        self._open_excess -= self._excess(num_samples)

    def observe(self, num_samples: int) -> None:
        """A question finished with ``num_samples`` samples."""
        self.num_questions += 1
        self.num_samples += num_samples
        if self.budget_per_question is not None:
            excess = num_samples - self.budget_per_question
            step = self.gain * (1.0 + self.warmup / self.num_questions) * excess
            self._base = min(_MAX_LOG_TAU, max(_MIN_LOG_TAU, self._base + step))
