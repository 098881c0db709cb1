"""Online self-consistency on a stream of recorded questions, as the service runs it.

Questions arrive one at a time in a seeded random order (a client at
concurrency 1); each is sampled in waves of :meth:`StoppingRule.wave_size`
until it stops, and the pacing controller learns ``tau`` from each finished
question. Unless ``first`` fixes it, a question's first wave is the share of
the budget that the stream's finished questions call for, and its cap is
lowered on flat streams (:class:`~blendserve.core.flatness.Flatness`), as a
``/v1`` pool learns them.
The method's spec reads
``online[:score=asc,cap=16,target=0.01,growth=0,extra=48,first=0.5]``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numpy.typing import NDArray

from blendserve.core.flatness import PROBE, Flatness
from blendserve.core.stopping import DEFAULT_CAP, SCORES, PacedThreshold, Score, StoppingRule
from blendserve.core.votes import VoteState
from blendserve.sim.data import Dataset
from blendserve.sim.runner import AnswerDraws

__all__ = ["OnlineRun", "OnlineSpec", "run_online"]


@dataclass(frozen=True)
class OnlineSpec:
    """Options of the online method.

    Attributes:
        score: the uncertainty thresholded (``asc`` or ``ppr``).
        cap: a question's cap, as a multiple of the mean budget.
        target: a fixed ``tau`` (a quality target) instead of pacing to the budget.
        growth: waves are at least this share of the samples a question has.
        extra: a question's cap is at most this many samples beyond the budget.
        first: a question's first wave is at least this share of the budget
            (None: learned from the flatness of the finished questions).
    """

    score: Score = "asc"
    cap: float = DEFAULT_CAP
    target: float | None = None
    growth: float = 0.0
    extra: float = 48.0
    first: float | None = None

    @classmethod
    def parse(cls, text: str) -> OnlineSpec:
        """Parses ``online``, ``online:score=ppr,cap=4`` or ``online:target=0.01``.

        Raises:
            ValueError: not an online spec, or a bad option.
        """
        name, _, rest = text.strip().partition(":")
        if name != "online":
            raise ValueError(f"not an online method: {text!r}")
        options: dict[str, Any] = {}
        for item in filter(None, rest.split(",")):
            key, sep, value = item.partition("=")
            try:
                if key == "score" and value in SCORES:
                    options[key] = value
                elif key in ("cap", "target", "growth", "extra", "first") and sep:
                    options[key] = float(value)
                else:
                    raise ValueError
            except ValueError:
                raise ValueError(
                    f"bad option {item!r} in {text!r} "
                    "(known: score=asc|ppr, cap=, target=, growth=, extra=, first=)"
                ) from None
        spec = cls(**options)
        if not (spec.growth >= 0 and spec.extra >= 0 and (spec.first or 0.0) >= 0):
            raise ValueError(f"growth, extra and first must be at least 0 in {text!r}")
        if not spec.cap >= 1.0:
            raise ValueError(f"cap must be at least 1 (a multiple of the budget), got {spec.cap}")
        if spec.target is not None and not 0.0 < spec.target < 1.0:
            raise ValueError(f"target must be in (0, 1), got {spec.target}")
        return spec


@dataclass
class OnlineRun:
    """One pass over the stream.

    Attributes:
        num_wrong: questions whose voted answer is not the true mode.
        samples: per question (in stream order), samples spent.
        rounds: per question, waves of samples requested.
        log_taus: per question, the threshold it started under.
    """

    num_wrong: int
    samples: NDArray[np.int64]
    rounds: NDArray[np.int64]
    log_taus: NDArray[np.float64] = field(default_factory=lambda: np.zeros(0))

    def running_mean(self) -> NDArray[np.float64]:
        """Mean samples per question after each finished question."""
        return np.cumsum(self.samples) / np.arange(1, len(self.samples) + 1)


def run_online(
    dataset: Dataset, spec: OnlineSpec, budget_per_question: float, seed: int
) -> OnlineRun:
    """Streams every question of ``dataset`` once, in a seeded random order.

    Args:
        dataset: the questions and their true distributions.
        spec: score, cap and optional fixed target.
        budget_per_question: the mean spend the threshold is paced to (also
            the unit of the cap).
        seed: seeds the order and the answer draws.
    """
    if spec.target is not None:
        pace = PacedThreshold(None, log_tau=math.log(spec.target))
    else:
        pace = PacedThreshold(budget_per_question)
    flatness = Flatness()
    draws = AnswerDraws(dataset, seed)
    order = np.random.default_rng((seed, 1)).permutation(dataset.num_questions)
    votes = VoteState(dataset.num_questions)
    samples = np.zeros(len(order), dtype=np.int64)
    rounds = np.zeros(len(order), dtype=np.int64)
    log_taus = np.zeros(len(order))
    num_wrong = 0
    for i, q in enumerate(order.tolist()):
        log_taus[i] = pace.log_tau
        share = flatness.share if spec.first is None else spec.first
        question_rule = StoppingRule.for_budget(
            budget_per_question, score=spec.score, cap=flatness.cap(spec.cap),
            max_extra=spec.extra, min_growth=spec.growth, first_share=share,
        )  # fmt: skip
        keys: list[int] = []
        while m := question_rule.wave_size(*votes.state(q), votes.num_samples[q], pace.log_tau):
            rounds[i] += 1
            before = votes.num_samples[q]
            for _ in range(m):
                keys.append(draws.next(q))
                votes.add(q, keys[-1])
            pace.spend(before, before + m)
        samples[i] = votes.num_samples[q]
        pace.close(votes.num_samples[q])
        pace.observe(votes.num_samples[q])
        flatness.observe(tuple(keys[:PROBE]))
        num_wrong += votes.answer(q) != 0
    return OnlineRun(num_wrong, samples, rounds, log_taus)
