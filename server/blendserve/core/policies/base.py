"""The allocation-policy contract shared by the simulator and the scheduler."""

from __future__ import annotations

import heapq
import math
import random
from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Hashable, Sequence

from blendserve.core.uncertainty import ppr_log_uncertainty
from blendserve.core.votes import VoteState
from blendserve.core.waves import WavePlan

__all__ = ["AllocationPolicy"]

# Reasons a question may not receive a sample now (bit flags, 0 = selectable).
_PENDING = 1
_CAPPED = 2
_FINISHED = 4
_CHOSEN = 8  # dispatched in the current select() call (max_in_flight > 1 only)


class AllocationPolicy(ABC):
    """Decides which questions receive the next samples of one total budget.

    ``select(k)`` returns up to ``k`` distinct questions and charges one sample to each (the
    ``budget``, at least one per question, is charged at dispatch and never exceeded); each
    is later recorded with ``observe(q, key)`` or refunded with ``cancel(q)``. A question
    is not selected while it has ``max_in_flight`` samples in flight (1 in the simulator; a
    scheduler raises it so that a question the ranking still puts first can take several in
    one request). A sample a scheduler stops waiting for (a straggler) is held
    (:meth:`hold`): no longer pending, it keeps its budget until it comes
    (:meth:`take_held`) or never will (:meth:`release`).

    Every question first gets one sample, in index order, before any gets a second; then
    :meth:`rank_state` ranks them, each pending sample counting as a vote for its
    question's leader ("virtual votes", as parallel tree search uses virtual loss). A
    question whose PPR-1v1 uncertainty falls to ``settle_delta`` settles (0: never); with a
    ``cap``, one holding more than ``cap`` times the mean samples per question is skipped.
    ``seed`` seeds the random tie-break.
    """

    #: Short name used by the simulator and the service.
    name: str = ""
    #: Whether the policy stops questions by a rule of its own (ESC's windows).
    _has_stopping_rule: bool = False
    #: Whether its choices depend on the total budget (the simulator then runs it per budget).
    budget_aware: bool = False
    #: Whether it plans waves (``plan_waves``): a job on an engine with room sends them.
    plans_waves: bool = False

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
        if budget < num_questions:
            raise ValueError(
                f"budget {budget} is below one sample per question ({num_questions} questions)"
            )
        if not 0.0 <= settle_delta < 1.0:
            raise ValueError(f"settle_delta must be in [0, 1), got {settle_delta}")
        if max_in_flight < 1:
            raise ValueError(f"max_in_flight must be at least 1, got {max_in_flight}")
        self.max_in_flight = max_in_flight
        if cap is not None and not cap > 1.0:  # NaN too
            raise ValueError(f"cap must exceed 1 (a multiple of the mean), got {cap}")
        self.cap = cap
        self.votes = VoteState(num_questions)
        self._num_questions = num_questions
        self.budget = budget
        self.num_dispatched = 0
        self.num_held = 0  # samples held (see hold): charged, neither pending nor observed
        self.settle_log_delta = math.log(settle_delta) if settle_delta > 0 else -math.inf
        self._settles = settle_delta > 0
        self.rng = random.Random(seed)
        # question index -> samples dispatched (observed + in flight)
        self.num_assigned: list[int] = [0] * num_questions
        self._flags = [0] * num_questions
        self._settled = [False] * num_questions
        self._num_pending = 0
        self._num_finished = 0
        # question index -> samples in flight
        self.num_pending_of: list[int] = [0] * num_questions
        self._unsampled: deque[int] = deque(range(num_questions))
        self._capped: list[tuple[int, int]] = []  # heap of (samples assigned, question)

    @property
    def num_questions(self) -> int:
        """Questions in the job."""
        return self.votes.num_questions

    @property
    def num_remaining(self) -> int:
        """Budget not yet dispatched."""
        return self.budget - self.num_dispatched

    @property
    def num_pending(self) -> int:
        """Samples dispatched and not yet observed or cancelled."""
        return self._num_pending

    @property
    def stops_early(self) -> bool:
        """Whether a question may stop before the budget is spent (settling, or ESC's rule)."""
        return self._settles or self._has_stopping_rule

    def is_settled(self, q: int) -> bool:
        """Whether question ``q`` was settled: by ``settle_delta`` or the policy's own stop."""
        return self._settled[q]

    @property
    def num_open(self) -> int:
        """Questions that may still get samples (not settled or stopped)."""
        return self._num_questions - self._num_finished

    def is_finished(self, q: int) -> bool:
        """Whether ``q`` will get no more samples: settled, stopped, or out of budget."""
        return bool(self._flags[q] & _FINISHED) or self.num_dispatched >= self.budget

    @property
    def done(self) -> bool:
        """No sample is in flight and none can be dispatched any more."""
        return self._num_pending == 0 and (self.num_remaining == 0 or not self._has_selectable())

    def lone_runway(self) -> int:
        """With one question open: further samples it may take now, blind, without passing
        a point where it could stop (the whole budget left when nothing stops it early)."""
        return 1 if self.stops_early else self.num_remaining

    def rank_state(self, q: int) -> tuple[int, int, int]:
        """``(n1, n2, K)`` that ranks ``q``: its votes plus one per pending sample for its leader
        (with no vote yet, one answer seen ``num_pending`` times). With ``max_in_flight == 1``
        a pending question cannot be chosen, and it ranks by its votes alone."""
        votes = self.votes
        num_pending = self.num_pending_of[q]
        if num_pending == 0 or self.max_in_flight == 1:
            return votes.n1[q], votes.n2[q], votes.num_distinct[q]
        return votes.n1[q] + num_pending, votes.n2[q], max(1, votes.num_distinct[q])

    def select(self, k: int = 1) -> list[int]:
        """Chooses up to ``k`` distinct questions for the next samples, best first; fewer
        (possibly none) when the budget or the selectable questions run out."""
        num_left = self.budget - self.num_dispatched
        if k > num_left:
            k = num_left
        chosen: list[int] = []
        while self._unsampled and len(chosen) < k:
            q = self._unsampled.popleft()
            if self._flags[q] == 0 and self.num_assigned[q] == 0:
                self._on_selectable(q, False)
                chosen.append(q)
                self._dispatch(q)
        if len(chosen) < k:
            picked = self._choose(k - len(chosen))  # already out of the selectable set
            for q in picked:
                self._dispatch(q)
            chosen += picked
        if self.max_in_flight > 1:
            # Distinct within one call; a question still selectable re-enters the
            # ranking with its new sample count.
            for q in chosen:
                self._clear(q, _CHOSEN)
        return chosen

    def plan_waves(self, plan: WavePlan, rounds: Sequence[int]) -> dict[int, int]:
        """The next wave of each question with none in flight (question -> samples), by ``plan``
        and the waves each question has had (``rounds``); for ``plans_waves`` only."""
        raise NotImplementedError(f"{self.name} does not plan waves")

    def assign(self, q: int, k: int) -> int:
        """Dispatches up to ``k`` samples of ``q`` chosen by a wave plan, not by the ranking, and
        returns how many: charged as by :meth:`select`, never beyond the budget, and none for
        a finished question."""
        k = min(k, self.budget - self.num_dispatched)
        if k <= 0 or self._flags[q] & _FINISHED:
            return 0
        if self._flags[q] == 0:
            self._on_selectable(q, False)
        self._flags[q] |= _CHOSEN  # out of the selectable set while it is dispatched
        for _ in range(k):
            self._dispatch(q)
        self._clear(q, _CHOSEN)
        return k

    def observe(self, q: int, key: Hashable | None, weight: float = 1) -> None:
        """Records a completed sample of ``q`` with canonical answer ``key`` (None: no
        extractable answer, spent but no vote), its vote counting ``weight`` (see
        :class:`~blendserve.core.votes.VoteState`)."""
        self._num_pending -= 1
        num_pending = self.num_pending_of[q] = self.num_pending_of[q] - 1
        self.votes.add(q, key, weight)
        if (
            self._settles
            and not self._settled[q]
            and self.votes.n1[q] > 0
            and ppr_log_uncertainty(*self.votes.state(q)) <= self.settle_log_delta
        ):
            self._settled[q] = True
            self._set(q, _FINISHED)
        before = self._flags[q]
        after = before & ~_PENDING if num_pending < self.max_in_flight else before
        self._flags[q] = after
        self._on_vote(q, key, before != 0 and after == 0)

    def cancel(self, q: int) -> None:
        """Refunds a dispatched sample of ``q`` that produced nothing."""
        self._num_pending -= 1
        self.num_pending_of[q] -= 1
        self.num_dispatched -= 1
        self.num_assigned[q] -= 1
        if self.num_assigned[q] == 0:
            self._unsampled.appendleft(q)
        if self.max_in_flight > 1:
            self._on_rank_change(q)
        if self.num_pending_of[q] < self.max_in_flight:
            self._clear(q, _PENDING)

    def hold(self, q: int, n: int) -> None:
        """``n`` pending samples of ``q`` stop being pending, still assigned and charged to it
        (stragglers): they hold no slot and are no virtual votes, and ``q`` may take others
        meanwhile, until each comes (:meth:`take_held`) or never will (:meth:`release`)."""
        if not 0 <= n <= self.num_pending_of[q]:
            raise ValueError(f"cannot hold {n} of the {self.num_pending_of[q]} samples pending")
        self._num_pending -= n
        self.num_pending_of[q] -= n
        self.num_held += n
        self._on_rank_change(q)
        if self.num_pending_of[q] < self.max_in_flight:
            self._clear(q, _PENDING)

    def take_held(self, q: int) -> bool:
        """A held sample of ``q`` came: pending again, to be observed; False where ``q`` is
        finished (settled or stopped) and takes no more: this one was spent for nothing."""
        self._unhold(1)
        if self._flags[q] & _FINISHED:
            return False
        self._num_pending += 1
        self.num_pending_of[q] += 1
        return True

    def release(self, q: int, n: int) -> None:
        """``n`` held samples of ``q`` will never come (cancelled or failed): refunded."""
        self._unhold(n)
        self.num_dispatched -= n
        self.num_assigned[q] -= n
        if n and self.num_assigned[q] == 0:
            self._unsampled.appendleft(q)
        self._on_rank_change(q)

    def _unhold(self, n: int) -> None:
        if not 0 <= n <= self.num_held:
            raise ValueError(f"cannot end {n} held samples of {self.num_held}")
        self.num_held -= n

    def stop(self, q: int) -> None:
        """Gives ``q`` no more samples (its caller went away); those in flight still count."""
        self._set(q, _FINISHED)

    def _dispatch(self, q: int) -> None:
        """Counts one sample of ``q``, which is already out of the selectable set."""
        self.num_dispatched += 1
        self._num_pending += 1
        num_assigned = self.num_assigned[q] = self.num_assigned[q] + 1
        num_pending = self.num_pending_of[q] = self.num_pending_of[q] + 1
        flags = self._flags[q] | (_PENDING if num_pending >= self.max_in_flight else _CHOSEN)
        self._flags[q] = flags
        if self.max_in_flight > 1:
            self._on_rank_change(q)
        if self.cap is not None:
            # Paper, section 4: questions holding more than cap x the mean are skipped.
            limit = self.cap * self.num_dispatched / self._num_questions
            if num_assigned > limit and not flags & _CAPPED:
                heapq.heappush(self._capped, (num_assigned, q))
                self._flags[q] = flags | _CAPPED
            while self._capped and self._capped[0][0] <= limit:
                self._clear(heapq.heappop(self._capped)[1], _CAPPED)

    def _set(self, q: int, flag: int) -> None:
        before = self._flags[q]
        if flag == _FINISHED and not before & _FINISHED:
            self._num_finished += 1
        self._flags[q] = before | flag
        if before == 0:
            self._on_selectable(q, False)

    def _clear(self, q: int, flag: int) -> None:
        before = self._flags[q]
        after = before & ~flag
        self._flags[q] = after
        if before != 0 and after == 0:
            self._on_selectable(q, True)

    def _finish(self, q: int) -> None:
        """Marks ``q`` as needing no more samples (policy-specific stop): it settled early."""
        self._settled[q] = True
        self._set(q, _FINISHED)

    @abstractmethod
    def _choose(self, k: int) -> list[int]:
        """Takes up to ``k`` distinct selectable questions, best first, out of the selectable
        set, to be dispatched next (``_on_selectable(q, False)`` is not called for them)."""

    @abstractmethod
    def _has_selectable(self) -> bool:
        """Whether any question can receive a sample now."""

    def _on_selectable(self, q: int, selectable: bool) -> None:
        """Hook: ``q`` became selectable (True) or stopped being selectable."""

    def _on_rank_change(self, q: int) -> None:
        """Hook: :meth:`rank_state` of ``q`` may have changed (a sample dispatched or refunded)."""

    def _on_vote(self, q: int, key: Hashable | None, selectable: bool) -> None:
        """Hook: one sample of ``q`` was observed (its vote and its pending count changed);
        with ``selectable`` it has just become selectable, and this stands for
        ``_on_selectable(q, True)`` (policies may do both in one step)."""
        if selectable:
            self._on_selectable(q, True)
        else:
            self._on_rank_change(q)
