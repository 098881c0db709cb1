"""The default batch policy: each sample where it is worth most, under how contested the
batch's own questions are (docs/policies.md, "The default policy").

ASC and PPR-1v1 rank a question whose first samples agree by chance as sure, and starve
it: on flat answer distributions they err more than plain self-consistency at the same
spend. The default (``rank="value"``) fits the batch's prior once every question has
``probe`` samples (:class:`~blendserve.core.worth.VoteWorth`) and gives each sample, or
wave, where it is expected to lower the chance of a wrong answer most; ``rank="asc"``
gives every question a uniform floor sized by the batch's flatness, then ranks by ASC. A
budget is a ceiling: a question stops once ASC's ``P[p1 < p2]`` is at most ``stop``.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Sequence
from typing import Literal

import numpy as np
from numpy.typing import NDArray

from blendserve.core.flatness import PROBE, cap_multiple, floor_share
from blendserve.core.policies.priority import PriorityPolicy
from blendserve.core.stopping import DEFAULT_CAP
from blendserve.core.uncertainty import asc_log_uncertainty
from blendserve.core.waves import WavePlan, expected_need, unanimous_need
from blendserve.core.worth import VoteWorth

__all__ = ["DEFAULT_STOP", "RANKS", "HedgePolicy"]

#: How questions are ranked: by the learned value of a sample, or by ASC's ``P[p1 < p2]``
#: over the floor.
RANKS = ("value", "asc")

#: ASC ``P[p1 < p2]`` at which a question stops (its answer is settled).
DEFAULT_STOP = 1e-3

# Priorities below this are the floor's (least-sampled first); above, the ranking's.
_FLOOR_PRIORITY = -1e12


class HedgePolicy(PriorityPolicy):
    """Each sample (and wave) where it is worth most under a prior learned from the batch's
    votes (``rank="value"``), or by ASC over a uniform floor (``rank="asc"``).

    Every question first gets ``probe`` samples; their disagreement sets the cap (with
    ``cap="auto"``: :func:`~blendserve.core.flatness.cap_multiple`). ``floor`` is a fixed
    floor share of the mean budget (None: none with ``rank="value"``, learned from the
    probe with ``rank="asc"``); ``stop`` the ASC ``P[p1 < p2]`` at which a question stops
    (0: never); the rest as for :class:`AllocationPolicy`.
    """

    name = "hedge"
    _has_stopping_rule = True
    budget_aware = True
    plans_waves = True

    def __init__(
        self,
        num_questions: int,
        budget: int,
        *,
        probe: int = PROBE,
        floor: float | None = None,
        stop: float = DEFAULT_STOP,
        cap: float | Literal["auto"] | None = "auto",
        rank: str = "value",
        **kwargs: object,
    ) -> None:
        if probe < 1:
            raise ValueError(f"probe must be at least 1, got {probe}")
        if floor is not None and not 0.0 <= floor <= 1.0:
            raise ValueError(f"floor must be in [0, 1], got {floor}")
        if not 0.0 <= stop < 0.5:
            raise ValueError(f"stop must be in [0, 0.5), got {stop}")
        if rank not in RANKS:
            raise ValueError(f"rank must be one of {', '.join(RANKS)}, got {rank!r}")
        self._rank = rank
        # Ranks by the value of a vote once the probe is back.
        self._worth: VoteWorth | None = None
        self.probe = min(probe, budget // max(1, num_questions))
        self._fixed_floor = floor
        self._floor = self.probe  # samples every question gets before ranking
        self._log_stop = math.log(stop) if stop > 0 else -math.inf
        self._num_probed = 0
        self._num_flat = 0
        self.disagreement: float | None = None  # known once every question was probed
        self._auto_cap = cap == "auto"
        fixed_cap = None if cap == "auto" else cap
        super().__init__(num_questions, budget, cap=fixed_cap, **kwargs)  # type: ignore[arg-type]

    @property
    def floor(self) -> int:
        """Samples every question gets before the ranking decides (while probing: the probe)."""
        return self._floor

    def priority(self, q: int) -> float:
        """The least-sampled first below the floor; then minus the value of a sample (a
        vote's, times the chance that a sample votes for the top two), else minus the
        log ASC uncertainty."""
        assigned = self.num_assigned[q]
        if assigned < self._floor:
            # Among equals, the question whose samples are back goes first.
            pending = self.num_pending_of[q]
            return _FLOOR_PRIORITY + assigned + (0.5 * pending / assigned if pending else 0.0)
        n1, n2, _ = self.rank_state(q)
        if self._worth is not None and (value := self._worth.worth(n1, n2)) > 0:
            return -value * (n1 + n2 + 1) / (assigned + 2)  # a sample's share of the top two
        # No value within the look-ahead (a long near-tie): after every question with one,
        # by ASC (a log uncertainty is below log 1/2).
        return -asc_log_uncertainty(n1, n2)

    def lone_runway(self) -> int:
        """Samples the open question may take before it could reach ``stop`` (all voting for
        its leader, pending samples too)."""
        if self._settles or self.num_open != 1 or not self.num_remaining:
            return super().lone_runway()
        q = next(q for q in range(self.num_questions) if not self.is_finished(q))
        n1, n2, _ = self.rank_state(q)
        left = self.num_remaining
        m = 1
        while m < left and asc_log_uncertainty(n1 + m, n2) > self._log_stop:
            m += 1
        return min(m, left)

    def plan_waves(self, plan: WavePlan, rounds: Sequence[int]) -> dict[int, int]:
        """The next wave of each question with none in flight: question -> samples.

        First every question's first wave; once all are back (the batch's flatness sets the
        cap, and the floor with ``rank="asc"``), the remaining budget split by
        :meth:`WavePlan.allocate` over the open questions' further samples, by their value
        (or ASC's expected uncertainty), each question sending its step of it. A question
        that has had ``plan.max_rounds`` waves (``rounds``: each question's) is stopped; one
        sure enough for now is planned 0 samples (its round passes). Empty: nothing to send
        until samples in flight come back (or nothing at all).
        """
        mean = self.budget / self.num_questions
        if self.disagreement is None:
            # Every question's first wave (topped up where samples came one at a time).
            first = plan.first_wave(mean)
            waves = {
                q: first - self.num_assigned[q]
                for q in range(self.num_questions)
                if self.num_assigned[q] < first
                and not self.num_pending_of[q]
                and not self.is_finished(q)
            }
            if waves or self.num_pending:
                return waves
            # Questions stopped before their probe (cut, abandoned): the rest decide.
            self._set_floor(self._num_flat / max(1, self._num_probed))
        votes = self.votes
        cap = round((self.cap or DEFAULT_CAP) * mean)
        open_questions = []
        for q in range(self.num_questions):
            if self.is_finished(q):
                continue
            if rounds[q] >= plan.max_rounds and not self.num_pending_of[q]:
                self.stop(q)
                continue
            open_questions.append(q)
        if not open_questions or self.num_remaining <= 0:
            return {}
        observed = votes.num_samples
        limits = [
            max(0, min(cap, plan.reach(observed[q], plan.max_rounds - rounds[q])) - observed[q])
            for q in open_questions
        ]
        rows = self._worth_rows(open_questions, limits)
        needs, log_price = plan.allocate(
            [(votes.n1[q], votes.n2[q], observed[q]) for q in open_questions],
            [self.num_pending_of[q] for q in open_questions],
            limits,
            [max(0, self._floor - observed[q]) for q in open_questions],
            self.num_remaining,
            self._log_stop if rows is None else -math.inf,
            rows,
        )
        sizes = {}
        for q, need in zip(open_questions, needs, strict=True):
            if self.num_pending_of[q]:
                continue
            n1, n2, n = votes.n1[q], votes.n2[q], observed[q]
            unanimous = None if rows is None else self._unanimous(q, need, log_price)
            k = plan.step(need, n1, n2, n, log_price, plan.max_rounds - rounds[q], unanimous)
            sizes[q] = max(0, k)
        return sizes

    def _share(self, q: int) -> float:
        """The estimated chance that a sample of ``q`` votes for its top two answers."""
        votes = self.votes
        return (votes.n1[q] + votes.n2[q] + 1) / (votes.num_samples[q] + 2)

    def _worth_rows(
        self, questions: list[int], limits: list[int]
    ) -> list[NDArray[np.float64]] | None:
        """Each question's further samples, valued (None: ranked by ASC), each row as long as
        ASC expects the question to need to reach ``stop`` (the budget is a ceiling)."""
        if self._worth is None:
            return None
        votes = self.votes
        rows = []
        for q, limit in zip(questions, limits, strict=True):
            n1, n2, n = votes.n1[q], votes.n2[q], votes.num_samples[q]
            ceiling = expected_need(n1, n2, n, self._log_stop, limit)
            rows.append(self._worth.log_gains(n1, n2, self._share(q), max(1, ceiling)))
        return rows

    def _unanimous(self, q: int, need: int, log_price: float) -> int:
        """What a wave of ``q`` all for its leader would need: to fall to the plan's
        ``log_price``, and never past ASC's stop."""
        assert self._worth is not None
        n1, n2 = self.votes.n1[q], self.votes.n2[q]
        by_value = self._worth.unanimous(n1, n2, self._share(q), log_price, need)
        return min(by_value, unanimous_need(n1, n2, self._log_stop, need))

    def _on_vote(self, q: int, key: Hashable | None, selectable: bool) -> None:
        super()._on_vote(q, key, selectable)
        votes = self.votes
        if self.disagreement is None and votes.num_samples[q] == self.probe:
            self._num_probed += 1
            self._num_flat += votes.n1[q] < self.probe
            if self._num_probed == self.num_questions:
                self._set_floor(self._num_flat / self.num_questions)
        if votes.n1[q] > 0 and asc_log_uncertainty(votes.n1[q], votes.n2[q]) <= self._log_stop:
            self._finish(q)
        if self._worth is not None and self._worth.due():
            self._refit()

    def _refit(self) -> None:
        """Refits the value of a vote to every question's votes; re-ranks if it changed."""
        assert self._worth is not None
        if self._worth.fit(self._top_two_votes()):
            for q in range(self.num_questions):
                self._on_rank_change(q)

    def _top_two_votes(self) -> NDArray[np.float64]:
        """``(n1, n2)`` of every question, a row each."""
        return np.column_stack((self.votes.n1, self.votes.n2)).astype(np.float64)

    def _set_floor(self, disagreement: float) -> None:
        self.disagreement = disagreement
        share = self._fixed_floor
        if self._rank == "value":
            self._worth = VoteWorth(refit_every=max(64, self.num_questions))
            self._worth.fit(self._top_two_votes())
        elif share is None:
            share = floor_share(disagreement)
        self._floor = max(self.probe, math.floor((share or 0.0) * self.budget / self.num_questions))
        if self._auto_cap:
            self.cap = cap_multiple(disagreement)
        for q in range(self.num_questions):
            self._on_rank_change(q)
