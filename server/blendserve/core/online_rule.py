"""The online rule in one place: how each question of a stream stops, how the stream is
paced, and what it learns from each finished question. ``/v1``'s pools and the
simulator's ``online`` method decide with an :class:`OnlineRule` and learn with a
:class:`StreamLearning`.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any

from blendserve.core.flatness import PROBE, Flatness
from blendserve.core.options import Option, parse_spec
from blendserve.core.price import PacedPrice
from blendserve.core.programme import VotePrior, start_log_price, start_log_price_known
from blendserve.core.stopping import DEFAULT_CAP, SCORES, Score, StoppingRule
from blendserve.core.waves import DEFAULT_MAX_ROUNDS

__all__ = ["MIN_TARGET", "PLANS", "OnlineRule", "StreamLearning"]

#: A quality target nearer certainty than this is held at it (the rule's floor).
MIN_TARGET = 1e-12
#: The first wave's share of the budget before any question has finished.
_FIRST_SHARE = 0.5


def _score(text: str) -> str:
    if text not in SCORES:
        raise ValueError(f"score must be one of {', '.join(SCORES)}")
    return text


#: How a bounded number of waves is sized: a programme over the stream's learned
#: prior (:class:`~blendserve.core.programme.VotePrior`), or by the expected ASC
#: uncertainty (:class:`~blendserve.core.waves.WavePlan`).
PLANS = ("bayes", "asc")


def _plan(text: str) -> str:
    if text not in PLANS:
        raise ValueError(f"plan must be one of {', '.join(PLANS)}")
    return text


_NUMBER = r"[0-9]+(\.[0-9]+)?"
_OPTIONS = {
    "score": Option(_score, "(" + "|".join(SCORES) + ")"),
    "plan": Option(_plan, "(" + "|".join(PLANS) + ")"),
    **{key: Option(float, _NUMBER) for key in ("cap", "target", "growth", "extra", "first")},
    "rounds": Option(int, "[0-9]+"),
}


@dataclass(frozen=True)
class OnlineRule:
    """Options of online stopping, as ``online[:score=asc,cap=16,target=0.01,...]`` writes them.

    ``cap`` is a multiple of the mean budget, at most ``extra`` samples beyond it;
    ``target`` a fixed price on the uncertainty (a quality target) instead of pacing to the
    budget; ``growth`` and ``first`` the least share of a question's samples a wave adds and
    of the budget its first wave takes (``first`` None: learned from the flatness of the
    finished questions); ``rounds`` waves per question at most (0: no bound); ``plan`` how
    bounded waves are sized (``bayes`` needs the stream's prior and an ``asc`` score paced
    to a budget). See :class:`~blendserve.core.stopping.StoppingRule`.
    """

    score: Score = "asc"
    cap: float = DEFAULT_CAP
    target: float | None = None
    growth: float = 0.0
    extra: float = 48.0
    first: float | None = None
    rounds: int = DEFAULT_MAX_ROUNDS
    plan: str = "bayes"

    def __post_init__(self) -> None:
        if not (self.growth >= 0 and self.extra >= 0 and (self.first or 0.0) >= 0):
            raise ValueError("growth, extra and first must be at least 0")
        if self.rounds < 0:
            raise ValueError(f"rounds must be at least 0, got {self.rounds}")
        if not self.cap >= 1.0:
            raise ValueError(f"cap must be at least 1 (a multiple of the budget), got {self.cap}")
        if self.target is not None and not 0.0 < self.target < 1.0:
            raise ValueError(f"target must be in (0, 1), got {self.target}")

    @classmethod
    def parse(cls, text: str) -> OnlineRule:
        """Parses ``online``, ``online:score=ppr,cap=4,rounds=4`` or ``online:target=0.01``.

        Raises:
            ValueError: not an online spec, or a bad option.
        """
        name, options = parse_spec(text, _OPTIONS)
        if name != "online":
            raise ValueError(f"not an online method: {text!r}")
        fields: dict[str, Any] = options
        return cls(**fields)

    def price(self, budget_per_question: float | None) -> PacedPrice:
        """A fresh price paced to ``budget_per_question`` (at least 1), or the fixed target.

        Raises:
            ValueError: neither a budget nor a target.
        """
        if self.target is not None:
            return PacedPrice(None, log_price=math.log(max(self.target, MIN_TARGET)))
        if budget_per_question is None:
            raise ValueError("online stopping needs a budget per question or a target")
        budget = max(1.0, budget_per_question)
        if self.planned:
            return PacedPrice(budget, log_price=start_log_price(budget, self.rounds))
        return PacedPrice(budget)

    def price_ready(self, budget_per_question: float | None) -> bool:
        """Whether :meth:`price` builds nothing: no start price to compute (a planned rule's
        bisects a programme's tables the first time for each budget)."""
        if not self.planned or budget_per_question is None:
            return True
        return start_log_price_known(max(1.0, budget_per_question), self.rounds)

    @property
    def planned(self) -> bool:
        """Whether a stream's prior sizes the waves (and the price is that of a top-two vote):
        the ``bayes`` plan of bounded waves, ASC's score, paced to a budget."""
        return (
            self.plan == "bayes" and self.rounds > 0 and self.score == "asc" and self.target is None
        )

    def stopping(
        self,
        budget_per_question: float,
        flatness: Flatness | None = None,
        prior: VotePrior | None = None,
    ) -> StoppingRule:
        """A question's rule for a mean budget; its first wave and cap follow ``flatness``,
        its waves ``prior`` where the plan is ``bayes`` and the rule is paced."""
        if self.first is not None:
            share = self.first
        else:
            share = flatness.share if flatness is not None else _FIRST_SHARE
        return StoppingRule.for_budget(
            budget_per_question,
            score=self.score,
            cap=flatness.cap(self.cap) if flatness is not None else self.cap,
            max_extra=self.extra,
            min_growth=self.growth,
            first_share=share,
            max_rounds=self.rounds,
            prior=prior if self.planned else None,
        )


@dataclass(eq=False)
class StreamLearning:
    """What a stream learns from its finished questions, and the rule its next one gets: its
    ``price`` (paced to ``budget_per_question``, or fixed by the rule's target; with no
    budget a question is capped at ``max_cap``), its ``flatness`` (how flat its answers
    were: its next first wave and cap) and its ``prior`` (how contested its questions were:
    their waves)."""

    rule: OnlineRule
    budget_per_question: float | None
    price: PacedPrice
    max_cap: int = 64
    flatness: Flatness = field(default_factory=Flatness)
    prior: VotePrior = field(default_factory=VotePrior)

    def stopping(self) -> StoppingRule:
        """The stopping rule of the stream's next question, as far as it has learned."""
        if self.budget_per_question is None:
            return StoppingRule(self.rule.score, self.max_cap, max_rounds=self.rule.rounds)
        return self.rule.stopping(self.budget_per_question, self.flatness, self.prior)

    def finished(
        self, n1: int, n2: int, num_samples: int, first_keys: Sequence[Hashable | None]
    ) -> None:
        """A question finished with ``n1`` and ``n2`` votes for its top two of
        ``num_samples``; ``first_keys`` are its first answer keys (abstentions None)."""
        self.price.observe(num_samples)
        self.flatness.observe(tuple(first_keys[:PROBE]))
        self.prior.observe(n1, n2, num_samples)
