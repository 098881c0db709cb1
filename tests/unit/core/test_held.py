"""Held samples: pending samples a scheduler stops waiting for, still charged to their question.

A job holds a straggler (``hold``): it frees its slot and its virtual votes,
but stays among its question's samples and keeps its budget; it votes if it
comes (``take_held``) and is refunded if it never does (``release``).
"""

import random

import pytest
from blendserve.core import POLICIES, PolicySpec
from blendserve.core.policies import AllocationPolicy


def _build(name: str, n: int, budget: int, **kwargs: object) -> AllocationPolicy:
    if name == "oracle":
        kwargs["margins"] = [0.05 * (i + 1) for i in range(n)]
    return PolicySpec(name).build(n, budget, **kwargs)


def test_a_held_sample_frees_its_slot_and_its_virtual_votes_but_stays_its_questions() -> None:
    policy = _build("asc", 2, 10, max_in_flight=10)
    assert policy.select(2) == [0, 1]
    policy.observe(0, "a")
    assert policy.assign(0, 3) == 3
    assert policy.rank_state(0) == (4, 0, 1)  # its vote, and three virtual ones
    remaining = policy.num_remaining
    policy.hold(0, 2)
    assert policy.num_pending_of[0] == 1 and policy.num_pending == 2
    assert policy.rank_state(0) == (2, 0, 1)
    assert policy.num_held == 2 and policy.num_assigned == [4, 1]
    assert policy.num_remaining == remaining  # no budget freed by holding


def test_a_question_whose_only_sample_is_held_counts_as_sampled() -> None:
    policy = _build("sc", 3, 9, max_in_flight=9)
    assert policy.select(2) == [0, 1]
    policy.hold(0, 1)
    # The unsampled question goes first, and the held one is not sampled again first.
    assert policy.select(1) == [2]
    assert policy.num_assigned == [1, 1, 1]


def test_a_held_sample_that_comes_votes_for_its_question() -> None:
    policy = _build("asc", 2, 4, max_in_flight=4)
    assert policy.select(2) == [0, 1]
    policy.hold(0, 1)
    assert policy.assign(1, 5) == 2  # the rest of the budget, the held sample's aside
    assert policy.num_remaining == 0
    assert policy.take_held(0)
    assert policy.num_held == 0 and policy.num_dispatched == 4
    assert policy.num_assigned == [1, 3] and policy.num_pending_of == [1, 3]
    policy.observe(0, "a")
    assert policy.votes.num_samples[0] == 1 and policy.num_pending_of[0] == 0


def test_a_held_sample_of_a_finished_question_is_spent_for_nothing() -> None:
    policy = _build("asc", 2, 6)
    assert policy.select(2) == [0, 1]
    policy.hold(1, 1)
    policy.stop(1)
    assert not policy.take_held(1)
    assert policy.num_dispatched == 2 and policy.num_held == 0
    assert policy.num_pending_of[1] == 0 and policy.num_remaining == 4


def test_held_samples_that_never_come_are_refunded() -> None:
    policy = _build("asc", 3, 9, max_in_flight=3)
    assert policy.select(3) == [0, 1, 2]
    policy.hold(2, 1)
    remaining = policy.num_remaining
    policy.release(2, 1)
    assert policy.num_held == 0 and policy.num_remaining == remaining + 1
    assert policy.num_assigned == [1, 1, 0]
    assert policy.select(1) == [2]  # unsampled again: it goes first


def test_what_is_not_pending_or_held_cannot_be_held_taken_or_released() -> None:
    policy = _build("asc", 2, 6)
    assert policy.select(2) == [0, 1]
    with pytest.raises(ValueError, match="cannot hold 2"):
        policy.hold(0, 2)
    with pytest.raises(ValueError, match="held"):
        policy.take_held(0)
    policy.hold(0, 1)
    with pytest.raises(ValueError, match="held"):
        policy.release(0, 2)
    assert policy.num_held == 1 and policy.num_dispatched == 2


@pytest.mark.parametrize("name", sorted(POLICIES))
def test_every_sample_charged_is_observed_pending_held_or_spent_for_nothing(name: str) -> None:
    """A job's samples, stragglers and their ends, in a seeded random order: every sample
    charged is accounted for, and the budget is never passed."""
    rng = random.Random(3)
    n, budget = 6, 60
    policy = _build(name, n, budget, seed=1, settle_delta=0.2, max_in_flight=budget)
    held: list[int] = []  # the questions of the samples held
    wasted = 0
    for _ in range(400):
        pending = [q for q in range(n) if policy.num_pending_of[q]]
        roll = rng.random()
        if roll < 0.3 and pending:
            q = rng.choice(pending)
            k = rng.randint(1, policy.num_pending_of[q])
            policy.hold(q, k)
            held += [q] * k
        elif roll < 0.45 and held:
            q = held.pop(rng.randrange(len(held)))
            if policy.take_held(q):
                policy.observe(q, rng.choice("ab"))
            else:
                wasted += 1
        elif roll < 0.55 and held:
            q = held.pop(rng.randrange(len(held)))
            policy.release(q, 1)
        elif roll < 0.58:  # answered, or its caller left
            policy.stop(rng.randrange(n))
        elif roll < 0.8 and pending:
            q = rng.choice(pending)
            policy.observe(q, rng.choice("aab"))
        else:
            policy.select(2)
        observed = sum(policy.votes.num_samples)
        assert policy.num_held == len(held)
        assert policy.num_dispatched == sum(policy.num_assigned) <= budget
        assert policy.num_dispatched == observed + policy.num_pending + len(held) + wasted
        assert policy.num_pending == sum(policy.num_pending_of)
