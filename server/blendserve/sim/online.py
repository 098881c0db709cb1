"""Online self-consistency on a stream of recorded questions, as the service runs it.

Questions arrive one at a time in a seeded random order (a client at
concurrency 1); each is sampled in waves of :meth:`StoppingRule.wave_size`
until it stops, and the pacing controller learns ``tau`` from each finished
question. Unless ``first`` fixes it, a question's first wave is the share of
the budget that the stream's finished questions call for, and its cap is
lowered on flat streams (:class:`~blendserve.core.flatness.Flatness`), and
with bounded rounds its waves are planned against the stream's learned
:class:`~blendserve.core.vote_prior.VotePrior`, as a ``/v1`` pool learns them.
The method's spec reads
``online[:score=asc,cap=16,target=0.01,growth=0,extra=48,first=0.5,rounds=4,plan=bayes]``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from numpy.typing import NDArray

from blendserve.core.flatness import PROBE, Flatness
from blendserve.core.online_rule import OnlineRule
from blendserve.core.vote_prior import VotePrior
from blendserve.core.votes import VoteState
from blendserve.sim.data import Dataset
from blendserve.sim.runner import AnswerDraws

__all__ = ["OnlineRun", "run_online"]


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
    dataset: Dataset, rule: OnlineRule, budget_per_question: float, seed: int
) -> OnlineRun:
    """Streams every question of ``dataset`` once, in a seeded random order.

    Args:
        dataset: the questions and their true distributions.
        rule: score, cap, waves and optional fixed target.
        budget_per_question: the mean spend the threshold is paced to (also
            the unit of the cap).
        seed: seeds the order and the answer draws.
    """
    pace = rule.threshold(budget_per_question)
    flatness = Flatness()
    prior = VotePrior()
    draws = AnswerDraws(dataset, seed)
    order = np.random.default_rng((seed, 1)).permutation(dataset.num_questions)
    votes = VoteState(dataset.num_questions)
    samples = np.zeros(len(order), dtype=np.int64)
    rounds = np.zeros(len(order), dtype=np.int64)
    log_taus = np.zeros(len(order))
    num_wrong = 0
    for i, q in enumerate(order.tolist()):
        log_taus[i] = pace.log_tau
        question_rule = rule.stopping(budget_per_question, flatness, prior)
        keys: list[int] = []
        while m := question_rule.wave_size(
            *votes.state(q), votes.num_samples[q], pace.log_tau, int(rounds[i])
        ):
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
        prior.observe(*votes.state(q)[:2], votes.num_samples[q])
        num_wrong += votes.answer(q) != 0
    return OnlineRun(num_wrong, samples, rounds, log_taus)
