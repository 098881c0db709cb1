"""Blend-ASC on a hand-worked example.

Three questions reach these states after 7 samples (t = 7):

    q0: a, b        -> (n1, n2, K) = (1, 1, 2): ASC 0.5,    PPR 1 * 2^-2 / B(2, 2) = 1.5
    q1: a, a, b, c  -> (2, 1, 3):              ASC 5/16,   PPR 2 * 2^-3 / B(3, 2) = 3.0
    q2: a           -> (1, 0, 1):              ASC 1/4,    PPR 1 * 2^-1 / B(2, 1) = 1.0

ASC ranks q0, q1, q2 = 0, 1, 2 and PPR ranks them 1, 0, 2, so the scores are
w, 1 - w and 2: q0 wins while w = t/T < 1/2, q1 after, and they tie at 1/2.
"""

import math
import random

import pytest
from blendserve.core import BlendPolicy, asc_log_uncertainty, ppr_log_uncertainty


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


def _brute_force_scores(policy: BlendPolicy) -> list[float]:
    """``(1 - w) rank_ASC + w rank_PPR`` from every question's rank state, by counting."""
    states = [policy.rank_state(q) for q in range(policy.num_questions)]
    asc = [asc_log_uncertainty(n1, n2) for n1, n2, _ in states]
    ppr = [ppr_log_uncertainty(*state) for state in states]

    def average_rank(values: list[float], q: int) -> float:
        above = sum(v > values[q] for v in values)  # rank 0 is the least sure
        return above + (sum(v == values[q] for v in values) - 1) / 2

    w = policy.weight()
    return [
        (1 - w) * average_rank(asc, q) + w * average_rank(ppr, q)
        for q in range(policy.num_questions)
    ]


def _answer(rng: random.Random, q: int, n: int) -> str | None:
    """Question q answers "a" with probability from 0.3 (q = 0) to 0.95, else b, c or d."""
    u = rng.random()
    if u < 0.05:
        return None
    return "a" if u < 0.3 + 0.65 * q / n else rng.choice("bcd")


@pytest.mark.parametrize("max_in_flight", [1, 3])
def test_ranks_match_a_brute_force_count_through_a_whole_budget(max_in_flight: int) -> None:
    n = 60
    rng = random.Random(11)
    policy = BlendPolicy(n, 20 * n, cap=None, seed=5, max_in_flight=max_in_flight)
    in_flight: list[int] = []
    while True:
        before = _brute_force_scores(policy)
        chosen = policy.select(1 if max_in_flight == 1 else 4)
        if not chosen:
            break
        if max_in_flight == 1 and policy.num_dispatched > n + 1:
            # Every question was selectable (no cap, nothing else in flight):
            # the choice had the least score.
            assert before[chosen[0]] == pytest.approx(min(before))
        in_flight += chosen
        while len(in_flight) > (0 if max_in_flight == 1 else 6):
            q = in_flight.pop(rng.randrange(len(in_flight)))
            policy.observe(q, _answer(rng, q, n))
        assert policy.scores().tolist() == pytest.approx(_brute_force_scores(policy))
    assert policy.num_dispatched == 20 * n


def test_many_distinct_states_grow_the_table() -> None:
    n = 100
    policy = BlendPolicy(n, 40 * n, cap=None, seed=2)
    # Question q reaches its own state: 10 + q % 10 votes for "a", q // 10 for "b".
    wanted = {q: ["a"] * (10 + q % 10) + ["b"] * (q // 10) for q in range(n)}
    while any(wanted.values()):
        _steer(policy, {q: keys.pop() for q, keys in wanted.items() if keys})
    assert len({policy.votes.state(q) for q in range(n)}) == n
    assert policy.scores().tolist() == pytest.approx(_brute_force_scores(policy))
    rng = random.Random(3)
    while chosen := policy.select(1):
        policy.observe(chosen[0], _answer(rng, chosen[0], n))
        if policy.num_remaining % 97 == 0:
            assert policy.scores().tolist() == pytest.approx(_brute_force_scores(policy))
