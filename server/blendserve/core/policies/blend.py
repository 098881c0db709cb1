"""Blend-ASC: the ASC rank early in the budget, the PPR-1v1 rank late.

At step ``t`` of budget ``T`` Blend-ASC samples the question minimising
``(1 - t/T) * rank_ASC + (t/T) * rank_PPR`` (paper, figure "Overview"), with
rank 0 the least sure question and average ranks for ties.

Questions with the same ``(n1, n2, max(2, K) - 1)`` share both scores, so the
ranks are kept per such *slot* instead of per question: a sample moves one
question between two slots, which shifts every slot's rank by
``sign(u_new - u) - sign(u_old - u)`` in one pass, with no sort. Empty slots
are recycled, so the arrays stay as small as the number of live states.
"""

from __future__ import annotations

from collections.abc import Hashable

import numpy as np
from numpy.typing import NDArray

from blendserve.core.policies._blend_kernel import best_slots, move_one
from blendserve.core.policies.base import AllocationPolicy
from blendserve.core.uncertainty import asc_log_uncertainty, ppr_log_uncertainty

__all__ = ["BlendPolicy"]

_SlotKey = tuple[int, int, int]


class BlendPolicy(AllocationPolicy):
    """Blend-ASC over one shared budget.

    Args:
        num_questions: questions in the job.
        budget: total samples T.
        settle_delta: PPR-1v1 error at which a question stops; 0 is pure Blend-ASC.
        cap: skip questions above ``cap`` times the mean samples (paper: 16).
        seed: seeds the random tie-break.
    """

    name = "blend"

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
        capacity = 64
        # row 0 is ASC, row 1 is PPR-1v1; slot -> log uncertainty of its state
        self._log_u: NDArray[np.float64] = np.zeros((2, capacity))
        # slot -> sum over questions t of 1 + sign(u_t - u_slot) = 2 * average rank + 1
        self._rank2: NDArray[np.float64] = np.zeros((2, capacity))
        self._count: NDArray[np.float64] = np.zeros(capacity)  # slot -> questions in it
        self._blocked: NDArray[np.bool_] = np.ones(capacity, dtype=np.bool_)  # no member
        self._tied: NDArray[np.int64] = np.zeros(capacity, dtype=np.int64)
        self._num_slots = 0
        self._members: list[list[int]] = []  # slot -> its selectable questions
        self._slot_ids: dict[_SlotKey, int] = {}
        self._slot_keys: list[_SlotKey] = []
        self._free_slots: list[int] = []
        self._slot_of = [0] * num_questions
        self._member_pos = list(range(num_questions))
        start = self._new_slot((0, 0, 1))
        self._log_u[:, start] = asc_log_uncertainty(0, 0), ppr_log_uncertainty(0, 0, 0)
        self._count[start] = num_questions
        self._rank2[:, start] = num_questions
        self._members[start] = list(range(num_questions))
        self._blocked[start] = False

    def weight(self) -> float:
        """``t / T``: the share of the budget already dispatched."""
        return self.num_dispatched / self.budget

    def scores(self) -> NDArray[np.float64]:
        """Per-question ``(1 - w) rank_ASC + w rank_PPR`` at the current step."""
        n = self._num_slots
        w = self.weight()
        per_slot = (1.0 - w) * self._rank2[0, :n] + w * self._rank2[1, :n]
        scores: NDArray[np.float64] = (per_slot[np.asarray(self._slot_of)] - 1.0) / 2.0
        return scores

    def _new_slot(self, key: _SlotKey) -> int:
        """A slot for ``key``, recycled if one is free; ``move_one`` fills it."""
        if self._free_slots:
            slot = self._free_slots.pop()
            self._slot_keys[slot] = key
        else:
            slot = self._num_slots
            if slot == len(self._count):
                self._grow()
            self._num_slots += 1
            self._members.append([])
            self._slot_keys.append(key)
        self._slot_ids[key] = slot
        return slot

    def _grow(self) -> None:
        capacity = 2 * len(self._count)
        self._log_u = np.concatenate([self._log_u, np.zeros_like(self._log_u)], axis=1)
        self._rank2 = np.concatenate([self._rank2, np.zeros_like(self._rank2)], axis=1)
        self._count = np.concatenate([self._count, np.zeros_like(self._count)])
        self._blocked = np.concatenate([self._blocked, np.ones_like(self._blocked)])
        self._tied = np.zeros(capacity, dtype=np.int64)

    def _on_vote(self, q: int, key: Hashable | None) -> None:
        if key is None:
            return
        votes = self.votes
        n1, n2, num_distinct = votes.n1[q], votes.n2[q], votes.num_distinct[q]
        slot_key = (n1, n2, num_distinct - 1 if num_distinct > 2 else 1)
        new = self._slot_ids.get(slot_key)
        created = new is None
        if new is None:
            new = self._new_slot(slot_key)
        old = self._slot_of[q]
        if new == old:
            return
        is_member = self._member_pos[q] >= 0
        if is_member:
            self._on_selectable(q, False)
        emptied = move_one(
            self._log_u, self._rank2, self._count, self._num_slots, old, new, created,
            self._num_questions, asc_log_uncertainty(n1, n2),
            ppr_log_uncertainty(n1, n2, num_distinct),
        )  # fmt: skip
        if emptied:
            del self._slot_ids[self._slot_keys[old]]
            self._free_slots.append(old)
        self._slot_of[q] = new
        if is_member:
            self._on_selectable(q, True)

    def _on_selectable(self, q: int, selectable: bool) -> None:
        slot = self._slot_of[q]
        members = self._members[slot]
        if selectable:
            self._member_pos[q] = len(members)
            members.append(q)
            self._blocked[slot] = False
            return
        pos = self._member_pos[q]
        last = members.pop()
        if last != q:
            members[pos] = last
            self._member_pos[last] = pos
        self._member_pos[q] = -1
        if not members:
            self._blocked[slot] = True

    def _has_selectable(self) -> bool:
        return not self._blocked[: self._num_slots].all()

    def _choose(self, k: int) -> list[int]:
        if k == 1:
            w = self.num_dispatched / self.budget
            num_tied = best_slots(self._rank2, self._blocked, self._num_slots, w, self._tied)
            if num_tied == 0:
                return []
            slot = int(self._tied[0]) if num_tied == 1 else self._random_slot(num_tied)
            members = self._members[slot]
            return [members[self.rng.randrange(len(members))]]
        n = self._num_slots
        w = self.weight()
        rank2 = self._rank2[:, :n]
        score = rank2[0] + w * (rank2[1] - rank2[0])
        score[self._blocked[:n]] = np.inf
        tie_break = np.array([self.rng.random() for _ in range(n)])
        chosen: list[int] = []
        for slot in np.lexsort((tie_break, score)):
            if score[slot] == np.inf or len(chosen) == k:
                break
            members = self._members[slot]
            chosen.extend(self.rng.sample(members, min(k - len(chosen), len(members))))
        return chosen

    def _random_slot(self, num_tied: int) -> int:
        # Uniform over the tied questions, not over the tied slots.
        tied = self._tied[:num_tied].tolist()
        pick = self.rng.randrange(sum(len(self._members[s]) for s in tied))
        for slot in tied:
            pick -= len(self._members[slot])
            if pick < 0:
                return int(slot)
        raise AssertionError("unreachable")
