"""Blend-ASC: the ASC rank early in the budget, the PPR-1v1 rank late.

At step ``t`` of budget ``T`` it samples the question minimising
``(1 - t/T) * rank_ASC + (t/T) * rank_PPR`` (paper, figure "Overview"), with rank 0
the least sure question and average ranks for ties. Questions in one state
``(n1, n2, max(2, K) - 1)`` of their ``rank_state`` share their ranks, so ranks are
kept per such *slot*, updated in one pass with no sort as a sample moves a question
between two slots (:mod:`._blend_kernel`).
"""

from __future__ import annotations

from collections.abc import Hashable
from functools import lru_cache

import numpy as np
from numpy.typing import NDArray

from blendserve.core.policies._blend_kernel import (
    COUNT,
    LOG_ASC,
    LOG_PPR,
    RANK_ASC,
    RANK_PPR,
    SLOT_OF,
    move_question,
    set_selectable,
    take_best,
)
from blendserve.core.policies.base import AllocationPolicy
from blendserve.core.uncertainty import asc_log_uncertainty, ppr_log_uncertainty

__all__ = ["BlendPolicy"]


@lru_cache(maxsize=1 << 16)
def _log_uncertainties(n1: int, n2: int, num_distinct: int) -> tuple[float, float]:
    """The ASC and PPR-1v1 log uncertainties of vote state ``(n1, n2, K)``."""
    # Memoised here, so the per-score caches are bypassed.
    asc = asc_log_uncertainty.__wrapped__(n1, n2)
    return asc, ppr_log_uncertainty.__wrapped__(n1, n2, num_distinct)


class BlendPolicy(AllocationPolicy):
    """Blend-ASC over one shared budget T; ``cap`` defaults to the paper's 16."""

    name = "blend"
    budget_aware = True

    def __init__(
        self,
        num_questions: int,
        budget: int,
        *,
        settle_delta: float = 0.0,
        cap: float | None = 16.0,
        seed: int = 0,
        max_in_flight: int = 1,
    ) -> None:
        super().__init__(
            num_questions, budget, settle_delta=settle_delta, cap=cap, seed=seed,
            max_in_flight=max_in_flight,
        )  # fmt: skip
        # The compiled state (see _blend_kernel): slot table, bucket starts, per question.
        self._capacity = 64
        self._table: NDArray[np.float64] = np.zeros((COUNT + 1, self._capacity))
        self._start: NDArray[np.int64] = np.full(self._capacity + 2, num_questions, dtype=np.int64)
        self._start[:2] = 0  # every question starts selectable, in slot 0
        self._questions: NDArray[np.int64] = np.zeros((3, num_questions), dtype=np.int64)
        self._questions[1:] = np.arange(num_questions)
        self._table[LOG_ASC : LOG_PPR + 1, 0] = _log_uncertainties(0, 0, 0)
        self._table[RANK_ASC : RANK_PPR + 1, 0] = num_questions
        self._table[COUNT, 0] = num_questions
        self._num_slots = 1

    def weight(self) -> float:
        """``t / T``: the share of the budget already dispatched."""
        return self.num_dispatched / self.budget

    def scores(self) -> NDArray[np.float64]:
        """Per-question ``(1 - w) rank_ASC + w rank_PPR`` at the current step."""
        w = self.weight()
        per_slot = (1.0 - w) * self._table[RANK_ASC] + w * self._table[RANK_PPR]
        scores: NDArray[np.float64] = (per_slot[self._questions[SLOT_OF]] - 1.0) / 2.0
        return scores

    def _on_vote(self, q: int, key: Hashable | None, selectable: bool) -> None:
        if key is None and self.max_in_flight == 1:  # no vote, no virtual one: same state
            if selectable:
                self._on_selectable(q, True)
            return
        self._move(q, selectable)

    def _on_rank_change(self, q: int) -> None:
        self._move(q, False)

    def _move(self, q: int, selectable: bool) -> None:
        """Puts ``q`` in the slot of its :meth:`rank_state`; makes it selectable if asked."""
        log_asc, log_ppr = _log_uncertainties(*self.rank_state(q))
        if self._num_slots == self._capacity:
            self._grow()
        self._num_slots = move_question(
            self._table, self._start, self._questions, self._num_slots, q,
            log_asc, log_ppr, selectable,
        )  # fmt: skip

    def _grow(self) -> None:
        empty = np.full(self._capacity, self._num_questions, dtype=np.int64)
        self._table = np.concatenate([self._table, np.zeros_like(self._table)], axis=1)
        self._start = np.concatenate([self._start, empty])
        self._capacity *= 2

    def _on_selectable(self, q: int, selectable: bool) -> None:
        set_selectable(self._start, self._questions, q, selectable)

    def _has_selectable(self) -> bool:
        # Bucket 0 holds the questions that are not selectable.
        return bool(self._start[1] < self._num_questions)

    def _choose(self, k: int) -> list[int]:
        w = self.num_dispatched / self.budget
        chosen: list[int] = []
        for _ in range(k):
            q = take_best(
                self._table, self._start, self._questions, self._num_slots, w, self.rng.random()
            )
            if q < 0:
                break
            chosen.append(q)
        return chosen


def warm_up() -> None:
    """Compiles the policy's kernels (or loads them from numba's cache) now, not on whatever
    thread first selects (in the service, the event loop's)."""
    policy = BlendPolicy(3, 6, settle_delta=0.1, max_in_flight=6)
    for key in ("a", None, "b"):
        (q,) = policy.select(1)
        policy.observe(q, key)
    (q,) = policy.select(1)
    policy.cancel(q)
    policy.stop(q)
