"""Policies whose choice depends on each question alone: SC, ESC, ASC, PPR-1v1, oracle.

Each ranks a question by a number that changes only when that question is sampled,
so a lazy heap serves them in O(log n) per decision.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Hashable, Sequence

from blendserve.core.policies.base import AllocationPolicy
from blendserve.core.uncertainty import asc_log_uncertainty, ppr_log_uncertainty

__all__ = ["ASCPolicy", "ESCPolicy", "OraclePolicy", "PPRPolicy", "PriorityPolicy", "SCPolicy"]


class PriorityPolicy(AllocationPolicy):
    """Samples the selectable question with the smallest ``priority(q)``.

    Ties are broken at random. Subclasses define ``priority``; it is read when
    a question becomes selectable, so it may change only when ``q`` is sampled.
    """

    def __init__(
        self,
        num_questions: int,
        budget: int,
        *,
        settle_delta: float = 0.0,
        cap: float | None = None,
        seed: int = 0,
        max_in_flight: int = 1,
    ) -> None:
        super().__init__(
            num_questions, budget, settle_delta=settle_delta, cap=cap, seed=seed,
            max_in_flight=max_in_flight,
        )  # fmt: skip
        # question -> token of its one live heap entry (-1: none)
        self._token = [-1] * num_questions
        self._next_token = 0
        self._heap: list[tuple[float, float, int, int]] = []
        self._num_selectable = 0
        for q in range(num_questions):
            self._on_selectable(q, True)

    def priority(self, q: int) -> float:
        """Smaller is sampled first."""
        raise NotImplementedError

    def _on_selectable(self, q: int, selectable: bool) -> None:
        if selectable:
            self._num_selectable += 1
            self._token[q] = token = self._next_token
            self._next_token += 1
            heapq.heappush(self._heap, (self.priority(q), self.rng.random(), token, q))
        else:
            self._num_selectable -= 1
            self._token[q] = -1

    def _on_rank_change(self, q: int) -> None:
        if self._token[q] >= 0:  # selectable: its entry must carry the new priority
            self._on_selectable(q, False)
            self._on_selectable(q, True)

    def _has_selectable(self) -> bool:
        return self._num_selectable > 0

    def _choose(self, k: int) -> list[int]:
        chosen: list[int] = []
        while self._heap and len(chosen) < k:
            _, _, token, q = heapq.heappop(self._heap)
            if self._token[q] == token:
                self._token[q] = -1  # taken: q is about to be dispatched
                self._num_selectable -= 1
                chosen.append(q)
        return chosen


class SCPolicy(PriorityPolicy):
    """Vanilla self-consistency: the same number of samples for every question."""

    name = "sc"

    def priority(self, q: int) -> float:
        """Samples assigned so far: the least-sampled question goes next."""
        return self.num_assigned[q]


class ESCPolicy(PriorityPolicy):
    """Early-stopping SC: sample in windows; stop a question on a unanimous window.

    Questions advance together (least-sampled first); a question stops when its latest
    complete window of ``window`` samples (ESC's default: 5) holds one answer. The
    final answer is the overall plurality, as for every policy.
    """

    name = "esc"
    _has_stopping_rule = True

    def __init__(
        self, num_questions: int, budget: int, *, window: int = 5, **kwargs: object
    ) -> None:
        if window < 1:
            raise ValueError(f"window must be at least 1, got {window}")
        self.window = window
        # question -> answer keys of its current, incomplete window
        self._windows: list[list[Hashable | None]] = [[] for _ in range(num_questions)]
        super().__init__(num_questions, budget, **kwargs)  # type: ignore[arg-type]

    def priority(self, q: int) -> float:
        """Samples assigned so far."""
        return self.num_assigned[q]

    def _on_vote(self, q: int, key: Hashable | None, selectable: bool) -> None:
        super()._on_vote(q, key, selectable)
        current = self._windows[q]
        current.append(key)
        if len(current) == self.window:
            if key is not None and current.count(key) == self.window:
                self._finish(q)
            current.clear()


class ASCPolicy(PriorityPolicy):
    """Adaptive-consistency, budgeted: sample the question with the largest ``P[p1 < p2]``."""

    name = "asc"

    def priority(self, q: int) -> float:
        """Minus the log ASC uncertainty (of :meth:`rank_state`)."""
        n1, n2, _ = self.rank_state(q)
        return -asc_log_uncertainty(n1, n2)


class PPRPolicy(PriorityPolicy):
    """PPR-1v1, budgeted: sample the question with the largest posterior density at 1/2."""

    name = "ppr"

    def priority(self, q: int) -> float:
        """Minus the log PPR-1v1 uncertainty (of :meth:`rank_state`)."""
        return -ppr_log_uncertainty(*self.rank_state(q))


class OraclePolicy(PriorityPolicy):
    """Fixed allocation knowing each question's true margin (``margins``): the simulator's baseline.

    Uses the error model ``err(x, q) = exp(-m_q x)`` with margin
    ``m_q = (sqrt(p1) - sqrt(p2))^2`` (paper, Theorem 1 and section 4.1), which
    is convex and decreasing in ``x``, and allocates greedily by the largest
    marginal error reduction ``exp(-m x) (1 - exp(-m))`` (appendix B).
    """

    name = "oracle"

    def __init__(
        self, num_questions: int, budget: int, *, margins: Sequence[float], **kwargs: object
    ) -> None:
        if len(margins) != num_questions:
            raise ValueError("one margin per question is required")
        self.margins = [float(m) for m in margins]
        super().__init__(num_questions, budget, **kwargs)  # type: ignore[arg-type]

    def priority(self, q: int) -> float:
        """Minus the log of the next sample's error reduction."""
        m = self.margins[q]
        if m <= 0.0:
            return math.inf
        return m * self.num_assigned[q] - math.log(-math.expm1(-m))
