"""The price of a sample: what its worth must exceed for it to be bought (docs/decisions.md).

A batch's budget sets it (its Lagrange multiplier,
:meth:`~blendserve.core.waves.WavePlan.allocate`); a stream paces it (:class:`PacedPrice`)
so that its mean spend meets the budget; a quality target fixes it. Its unit is the
worth's: ASC's ``P[p1 < p2]`` for an uncertainty rule, the fall in the chance of a wrong
answer per top-two vote under a learned prior.
"""

from __future__ import annotations

import math

__all__ = ["PacedPrice", "first_log_price"]

# The log price stays within these (ASC is at most 0.5; PPR-1v1 is a density ratio, it
# may exceed 1: one unanimous sample scores 1).
_MIN_LOG_PRICE = math.log(1e-12)
_MAX_LOG_PRICE = math.log(4.0)

_LOG2 = math.log(2.0)


def first_log_price(budget_per_question: float) -> float:
    """A cautious first log price for a mean budget, before any question is seen: where a
    unanimous question stops after half the budget (on ASC's uncertainty), derived from the
    rule, not fitted on any data. The pacing learns the stream's own price from there."""
    unanimous = max(1.0, budget_per_question) / 2.0
    return max(_MIN_LOG_PRICE, -(unanimous + 1.0) * _LOG2)


class PacedPrice:
    """The price of a sample, learned online so that the mean samples per question meet a budget.

    Two terms: a slow estimate of the price whose expected spend is the budget (stochastic
    approximation: the ``n``-th finished question moves the log price by its excess spend
    times ``gain * (1 + warmup / n)``, larger at first so that a cold start converges), and
    a correction proportional to the debt, the samples spent beyond the budget so far,
    repaid over ``horizon`` questions: it keeps the *running mean* on target even where
    spend is a step function of the price. Open questions count in the debt as soon as they
    pass the budget (:meth:`spend`), so many in flight do not overshoot together.

    ``log_price`` is the first price (default: :func:`first_log_price`), fixed with
    ``budget_per_question=None`` (a quality target instead of a budget).
    """

    def __init__(
        self,
        budget_per_question: float | None,
        *,
        log_price: float | None = None,
        gain: float = 0.003,
        warmup: float = 20.0,
        horizon: float = 50.0,
    ) -> None:
        if budget_per_question is not None and not budget_per_question >= 1.0:
            raise ValueError(f"budget_per_question must be at least 1, got {budget_per_question}")
        if log_price is None:
            if budget_per_question is None:
                raise ValueError("a fixed price needs log_price")
            log_price = first_log_price(budget_per_question)
        if not _MIN_LOG_PRICE <= log_price <= _MAX_LOG_PRICE:
            raise ValueError(f"log_price must be in [log 1e-12, log 4], got {log_price}")
        if not gain > 0 or not horizon > 0 or not warmup >= 0:
            raise ValueError("gain and horizon must be positive, warmup at least 0")
        self.budget_per_question = budget_per_question
        self.gain = gain
        self.warmup = warmup
        self.horizon = horizon
        self._base = log_price
        self._open_excess = 0.0
        self.num_questions = 0
        self.num_samples = 0

    @property
    def paced(self) -> bool:
        """Whether the price follows a budget (else a quality target fixes it)."""
        return self.budget_per_question is not None

    @property
    def debt(self) -> float:
        """Samples spent beyond the budget: by finished questions, and open ones past it."""
        if self.budget_per_question is None:
            return 0.0
        finished = self.num_samples - self.budget_per_question * self.num_questions
        return finished + self._open_excess

    @property
    def log_price(self) -> float:
        """The price now, in log space."""
        if self.budget_per_question is None:
            return self._base
        # A debt of `horizon` samples raises the log price by what about one sample of a
        # unanimous question is worth (ASC halves per vote: log 2).
        correction = math.log(2.0) * self.debt / self.horizon
        return min(_MAX_LOG_PRICE, max(_MIN_LOG_PRICE, self._base + correction))

    @property
    def price(self) -> float:
        """The price now."""
        return math.exp(self.log_price)

    @property
    def mean_samples(self) -> float:
        """Mean samples per finished question (0 before the first)."""
        return self.num_samples / self.num_questions if self.num_questions else 0.0

    @property
    def pacing_error(self) -> float:
        """``mean_samples / budget - 1`` (0 for a fixed price or before any question)."""
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
            self._base = min(_MAX_LOG_PRICE, max(_MIN_LOG_PRICE, self._base + step))
