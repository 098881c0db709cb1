"""Blend-ASC on a hand-worked example.

Three questions reach these states after 7 samples (t = 7):

    q0: a, b        -> (n1, n2, K) = (1, 1, 2): ASC 0.5,    PPR 1 * 2^-2 / B(2, 2) = 1.5
    q1: a, a, b, c  -> (2, 1, 3):              ASC 5/16,   PPR 2 * 2^-3 / B(3, 2) = 3.0
    q2: a           -> (1, 0, 1):              ASC 1/4,    PPR 1 * 2^-1 / B(2, 1) = 1.0

ASC ranks q0, q1, q2 = 0, 1, 2 and PPR ranks them 1, 0, 2, so the scores are
w, 1 - w and 2: q0 wins while w = t/T < 1/2, q1 after, and they tie at 1/2.
"""

import math

import pytest
from blendserve.core import BlendPolicy


def _steer(policy: BlendPolicy, wanted: dict[int, str]) -> None:
    """Dispatches to every selectable question, observes the wanted ones, refunds the rest."""
    for q in policy.select(policy.num_questions):
        if q in wanted:
            policy.observe(q, wanted[q])
        else:
            policy.cancel(q)


def _hand_worked(budget: int, seed: int = 0) -> BlendPolicy:
    policy = BlendPolicy(3, budget, seed=seed)
    _steer(policy, {0: "a", 1: "a", 2: "a"})  # the first sample of each, t = 3
    _steer(policy, {0: "b", 1: "a"})
    _steer(policy, {1: "b"})
    _steer(policy, {1: "c"})
    assert policy.num_dispatched == 7
    assert policy.votes.state(0) == (1, 1, 2)
    assert policy.votes.state(1) == (2, 1, 3)
    assert policy.votes.state(2) == (1, 0, 1)
    return policy


@pytest.mark.parametrize("budget,expected", [(28, 0), (10, 1)])
def test_choice_follows_the_weight(budget: int, expected: int) -> None:
    policy = _hand_worked(budget)
    w = 7 / budget
    assert policy.weight() == pytest.approx(w)
    assert policy.scores().tolist() == pytest.approx([w, 1 - w, 2.0])
    assert policy.select(1) == [expected]


def test_equal_scores_are_broken_at_random() -> None:
    chosen = {_hand_worked(14, seed).select(1)[0] for seed in range(40)}
    assert chosen == {0, 1}


def test_average_ranks_for_tied_questions() -> None:
    policy = BlendPolicy(4, 40)
    for q in policy.select(4):
        policy.observe(q, "same")
    # All four in one state: average rank (0 + 1 + 2 + 3) / 4.
    assert policy.scores().tolist() == [1.5] * 4


def test_every_question_first_gets_one_sample_in_order() -> None:
    policy = BlendPolicy(5, 50)
    firsts = []
    for _ in range(5):
        (q,) = policy.select(1)
        policy.observe(q, "x")
        firsts.append(q)
    assert firsts == [0, 1, 2, 3, 4]


def test_last_sample_of_the_budget() -> None:
    policy = BlendPolicy(3, 9, seed=1)
    for step in range(9):
        assert policy.weight() == pytest.approx(step / 9)
        (q,) = policy.select(1)
        policy.observe(q, f"{q}-{step % 2}")
    assert policy.num_remaining == 0
    assert policy.select(1) == []
    assert policy.done


@pytest.mark.parametrize("cap", [16.0, 3.0])
def test_cap_skips_questions_far_above_the_mean(cap: float) -> None:
    n = 40
    policy = BlendPolicy(n, 60 * n, cap=cap, seed=3)
    most = 0
    while chosen := policy.select(1):
        (q,) = chosen
        mean = policy.num_dispatched / n
        # A question is chosen only while at most cap x the mean.
        assert policy.num_assigned[q] - 1 <= cap * (policy.num_dispatched - 1) / n
        most = max(most, policy.num_assigned[q] / mean)
        # Question 0 never settles (two answers in turn), so it draws the
        # samples until the cap holds it back; the others agree at once.
        policy.observe(q, policy.num_assigned[q] % 2 if q == 0 else "sure")
    assert most > cap * 0.9


def test_without_cap_the_unsure_question_takes_more() -> None:
    n = 40
    policy = BlendPolicy(n, 60 * n, cap=None, seed=3)
    while chosen := policy.select(1):
        (q,) = chosen
        policy.observe(q, policy.num_assigned[q] % 2 if q == 0 else "sure")
    assert policy.num_assigned[0] > 16 * 60


def test_large_counts_keep_selection_finite() -> None:
    policy = BlendPolicy(2, 4_000, cap=None, seed=0)
    while chosen := policy.select(1):
        (q,) = chosen
        policy.observe(q, "a" if q == 0 or policy.num_assigned[q] % 3 else "b")
    assert policy.num_assigned[0] + policy.num_assigned[1] == 4_000
    assert all(math.isfinite(s) for s in policy.scores())
