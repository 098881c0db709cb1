"""Policies put in a given state, for tests of what they decide next."""

from __future__ import annotations

from blendserve.core.policies import AllocationPolicy


def give_votes(policy: AllocationPolicy, votes: list[list[str]]) -> None:
    """Dispatches and observes ``votes[q]``, in order, for every question ``q``."""
    for q, answers in enumerate(votes):
        policy.assign(q, len(answers))
        for answer in answers:
            policy.observe(q, answer)
