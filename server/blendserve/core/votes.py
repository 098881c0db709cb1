"""Vote state: per-question answer counts and the arrays the policies read."""

from __future__ import annotations

from collections.abc import Hashable

import numpy as np
from numpy.typing import NDArray

__all__ = ["VoteState"]


class VoteState:
    """Counts of canonical answers per question, updated in O(1) per sample.

    The derived arrays are what every policy reads: ``num_samples`` (samples
    observed, abstentions included), ``n1 >= n2`` (the two largest counts) and
    ``num_distinct`` (distinct answers seen, K-hat). The leading answer of a
    question is the first answer to reach ``n1``; a later answer must exceed
    it to take the lead, so ties never favour an answer by its value.

    A vote may carry a ``weight`` in [0, 1] (its trace's confidence, read by
    :class:`~blendserve.core.traces.TraceLearner`): ``counts`` and the lead are then
    weighted, and ``n1``/``n2`` are the weighted top two rounded to whole votes, so that
    every policy values a question by its weighted votes with the tables it has. A
    weight never raises a count past the samples behind it. Unweighted votes (weight 1)
    count as they always did, in integers.
    """

    def __init__(self, num_questions: int) -> None:
        if num_questions < 1:
            raise ValueError("a vote state needs at least one question")
        self.num_questions = num_questions
        # question index -> {answer key -> votes}
        self.counts: list[dict[Hashable, float]] = [{} for _ in range(num_questions)]
        # question index -> leading answer key (None before the first vote)
        self.leaders: list[Hashable | None] = [None] * num_questions
        # question index -> samples observed / two largest counts / distinct answers
        self.num_samples: list[int] = [0] * num_questions
        self.n1: list[int] = [0] * num_questions
        self.n2: list[int] = [0] * num_questions
        self.num_distinct: list[int] = [0] * num_questions
        # question index -> the two largest weighted counts (equal to n1, n2 unweighted)
        self._top1: list[float] = [0] * num_questions
        self._top2: list[float] = [0] * num_questions

    def add(self, q: int, key: Hashable | None, weight: float = 1) -> None:
        """Records one sample of question ``q``; ``key=None`` abstains (no vote). ``weight``
        (in [0, 1]) is what its vote counts."""
        self.num_samples[q] += 1
        if key is None:
            return
        if not 0 <= weight <= 1:
            raise ValueError(f"a vote's weight must be in [0, 1], got {weight}")
        if weight == 1:
            weight = 1  # a whole vote: counts stay whole numbers where nothing weighs less
        votes = self.counts[q]
        seen = key in votes
        count = votes.get(key, 0) + weight
        votes[key] = count
        if not seen:
            self.num_distinct[q] += 1
        if key == self.leaders[q]:
            self._top1[q] = count
        elif count > self._top1[q]:
            self._top2[q] = self._top1[q]
            self._top1[q] = count
            self.leaders[q] = key
        elif count > self._top2[q]:
            self._top2[q] = count
        self.n1[q], self.n2[q] = round(self._top1[q]), round(self._top2[q])

    def answer(self, q: int) -> Hashable | None:
        """The plurality answer of question ``q`` (None before any vote)."""
        return self.leaders[q]

    def state(self, q: int) -> tuple[int, int, int]:
        """``(n1, n2, num_distinct)`` of question ``q``."""
        return self.n1[q], self.n2[q], self.num_distinct[q]

    def arrays(self) -> dict[str, NDArray[np.int64]]:
        """The derived per-question arrays as numpy arrays (a copy)."""
        return {
            name: np.asarray(getattr(self, name), dtype=np.int64)
            for name in ("num_samples", "n1", "n2", "num_distinct")
        }
