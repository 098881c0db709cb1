"""Online self-consistency on a stream of recorded questions, as the service runs it.

Questions arrive one at a time in a seeded random order (a client at concurrency 1), each
sampled in waves of :meth:`StoppingRule.wave_size` until it stops; the stream learns from
each what a ``/v1`` pool learns (:class:`~blendserve.core.online_rule.StreamLearning`).
The method's spec reads
``online[:score=asc,cap=16,target=0.01,growth=0,extra=48,first=0.5,rounds=4,plan=bayes]``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from numpy.typing import NDArray

from blendserve.core.online_rule import OnlineRule, StreamLearning
from blendserve.core.votes import VoteState
from blendserve.sim.data import Dataset
from blendserve.sim.runner import AnswerDraws

__all__ = ["OnlineRun", "run_online"]


@dataclass
class OnlineRun:
    """One pass over the stream: ``num_wrong`` questions whose voted answer is not the true
    mode, and per question (in stream order) the samples spent, the waves (``rounds``)
    requested, the log price it started under and its index in the dataset
    (``questions``)."""

    num_wrong: int
    samples: NDArray[np.int64]
    rounds: NDArray[np.int64]
    log_prices: NDArray[np.float64] = field(default_factory=lambda: np.zeros(0))
    questions: NDArray[np.int64] = field(default_factory=lambda: np.zeros(0, dtype=np.int64))

    def running_mean(self) -> NDArray[np.float64]:
        """Mean samples per question after each finished question."""
        return np.cumsum(self.samples) / np.arange(1, len(self.samples) + 1)


def run_online(
    dataset: Dataset, rule: OnlineRule, budget_per_question: float, seed: int
) -> OnlineRun:
    """Streams every question of ``dataset`` once, in an order and with answer draws that
    ``seed`` seeds, paced to ``budget_per_question`` (also the unit of the cap)."""
    learning = StreamLearning(rule, budget_per_question, rule.price(budget_per_question))
    price = learning.price
    draws = AnswerDraws(dataset, seed)
    order = np.random.default_rng((seed, 1)).permutation(dataset.num_questions)
    votes = VoteState(dataset.num_questions)
    samples = np.zeros(len(order), dtype=np.int64)
    rounds = np.zeros(len(order), dtype=np.int64)
    log_prices = np.zeros(len(order))
    num_wrong = 0
    for i, q in enumerate(order.tolist()):
        log_prices[i] = price.log_price
        question_rule = learning.stopping()
        keys: list[int] = []
        while m := question_rule.wave_size(
            *votes.state(q), votes.num_samples[q], price.log_price, int(rounds[i])
        ):
            rounds[i] += 1
            before = votes.num_samples[q]
            for _ in range(m):
                keys.append(draws.next(q))
                votes.add(q, keys[-1])
            price.spend(before, before + m)
        samples[i] = votes.num_samples[q]
        price.close(votes.num_samples[q])
        learning.finished(*votes.state(q)[:2], votes.num_samples[q], keys)
        num_wrong += votes.answer(q) != 0
    return OnlineRun(num_wrong, samples, rounds, log_prices, order)
