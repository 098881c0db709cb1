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
    """

    def __init__(self, num_questions: int) -> None:
        if num_questions < 1:
            raise ValueError("a vote state needs at least one question")
        self.num_questions = num_questions
        # question index -> {answer key -> votes}
        self.counts: list[dict[Hashable, int]] = [{} for _ in range(num_questions)]
        # question index -> leading answer key (None before the first vote)
        self.leaders: list[Hashable | None] = [None] * num_questions
        # question index -> samples observed / two largest counts / distinct answers
        self.num_samples: list[int] = [0] * num_questions
        self.n1: list[int] = [0] * num_questions
        self.n2: list[int] = [0] * num_questions
        self.num_distinct: list[int] = [0] * num_questions

    def add(self, q: int, key: Hashable | None) -> None:
        """Records one sample of question ``q``; ``key=None`` abstains (no vote)."""
        self.num_samples[q] += 1
        if key is None:
            return
        votes = self.counts[q]
        count = votes.get(key, 0) + 1
        votes[key] = count
        if count == 1:
            self.num_distinct[q] += 1
        if key == self.leaders[q]:
            self.n1[q] = count
        elif count > self.n1[q]:
            self.n2[q] = self.n1[q]
            self.n1[q] = count
            self.leaders[q] = key
        elif count > self.n2[q]:
            self.n2[q] = count

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
