"""Held samples: pending samples a scheduler stops waiting for, that keep their budget.

A job holds a straggler (``hold``): it frees its slot and its virtual votes
but not its budget, which it spends if it comes (``take_held``) or frees if
it never does (``release``): the same as refunding it and taking its sample
off the budget by hand.
"""

import random

import pytest
from blendserve.core import POLICIES, PolicySpec
from blendserve.core.policies import AllocationPolicy


def _build(name: str, n: int, budget: int, **kwargs: object) -> AllocationPolicy:
    if name == "oracle":
        kwargs["margins"] = [0.05 * (i + 1) for i in range(n)]
    return PolicySpec(name).build(n, budget, **kwargs)


def test_a_held_sample_frees_its_slot_and_its_virtual_votes_but_not_its_budget() -> None:
    policy = _build("asc", 2, 10, max_in_flight=10)
    assert policy.select(2) == [0, 1]
    policy.observe(0, "a")
    assert policy.assign(0, 3) == 3
    assert policy.rank_state(0) == (4, 0, 1)  # its vote, and three virtual ones
    remaining = policy.num_remaining
    policy.hold(0, 2)
    assert policy.num_pending_of[0] == 1 and policy.num_pending == 2
    assert policy.rank_state(0) == (2, 0, 1)
    assert policy.num_held == 2 and policy.budget == 8 and policy.num_dispatched == 3
    assert policy.num_remaining == remaining  # no budget freed by holding


def test_a_held_sample_that_comes_is_dispatched_to_its_question_on_the_budget_it_held() -> None:
    policy = _build("asc", 2, 4, max_in_flight=4)
    assert policy.select(2) == [0, 1]
    policy.hold(0, 1)
    assert policy.assign(1, 5) == 2  # the rest of the budget, the held sample's aside
    assert policy.num_remaining == 0
    assert policy.take_held(0)
    assert policy.num_held == 0 and policy.budget == 4 and policy.num_dispatched == 4
    assert policy.num_assigned == [1, 3] and policy.num_pending_of == [1, 3]
    policy.observe(0, "a")
    assert policy.votes.num_samples[0] == 1


def test_a_held_sample_of_a_finished_question_is_spent_for_nothing() -> None:
    policy = _build("asc", 2, 6)
    assert policy.select(2) == [0, 1]
    policy.hold(1, 1)
    policy.stop(1)
    assert not policy.take_held(1)
    # Its budget stays spent: the budget is one less, and nothing of 1 is pending.
    assert policy.budget == 5 and policy.num_dispatched == 1 and policy.num_held == 0
    assert policy.num_pending_of[1] == 0 and policy.num_remaining == 4


def test_held_samples_that_never_come_free_their_budget() -> None:
    policy = _build("asc", 3, 9, max_in_flight=3)
    assert policy.select(3) == [0, 1, 2]
    policy.hold(2, 1)
    remaining = policy.num_remaining
    policy.release(1)
    assert policy.budget == 9 and policy.num_held == 0
    assert policy.num_remaining == remaining + 1


def test_what_is_not_pending_or_held_cannot_be_held_taken_or_released() -> None:
    policy = _build("asc", 2, 6)
    assert policy.select(2) == [0, 1]
    with pytest.raises(ValueError, match="cannot hold 2"):
        policy.hold(0, 2)
    with pytest.raises(ValueError, match="held"):
        policy.take_held(0)
    policy.hold(0, 1)
    with pytest.raises(ValueError, match="held"):
        policy.release(2)
    assert policy.num_held == 1 and policy.budget == 5


def _state(policy: AllocationPolicy) -> tuple[object, ...]:
    return (
        policy.budget,
        policy.num_dispatched,
        policy.num_pending,
        list(policy.num_pending_of),
        list(policy.num_assigned),
        [policy.is_finished(q) for q in range(policy.num_questions)],
        [policy.rank_state(q) for q in range(policy.num_questions)],
    )


@pytest.mark.parametrize("name", sorted(POLICIES))
def test_holding_is_refunding_with_the_budget_kept_by_hand(name: str) -> None:
    """A job's sequence of samples, stragglers and their ends, played on two policies: one
    through hold, take_held and release, one refunded and charged by hand."""
    rng = random.Random(3)
    n, budget = 6, 60
    kwargs = {"seed": 1, "settle_delta": 0.2, "max_in_flight": budget}
    ours, theirs = _build(name, n, budget, **kwargs), _build(name, n, budget, **kwargs)
    held: list[int] = []  # the questions of the samples held
    for _ in range(400):
        pending = [q for q in range(n) if ours.num_pending_of[q]]
        roll = rng.random()
        if roll < 0.3 and pending:
            q = rng.choice(pending)
            k = rng.randint(1, ours.num_pending_of[q])
            ours.hold(q, k)
            for _ in range(k):
                theirs.cancel(q)
            theirs.budget -= k
            held += [q] * k
        elif roll < 0.45 and held:
            q = held.pop(rng.randrange(len(held)))
            theirs.budget += 1
            came = theirs.assign(q, 1)
            if not came:
                theirs.budget -= 1
            assert ours.take_held(q) == bool(came)
            if came:
                key = rng.choice("ab")
                ours.observe(q, key)
                theirs.observe(q, key)
        elif roll < 0.55 and held:
            held.pop(rng.randrange(len(held)))
            ours.release(1)
            theirs.budget += 1
        elif roll < 0.58:  # answered, or its caller left
            q = rng.randrange(n)
            ours.stop(q)
            theirs.stop(q)
        elif roll < 0.8 and pending:
            q = rng.choice(pending)
            key = rng.choice("aab")
            ours.observe(q, key)
            theirs.observe(q, key)
        else:
            assert ours.select(2) == theirs.select(2)
        assert _state(ours) == _state(theirs)
        assert ours.num_held == len(held)
