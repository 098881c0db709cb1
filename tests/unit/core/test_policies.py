import math
import random

import pytest
from blendserve.core import POLICIES, ASCPolicy, ESCPolicy, OraclePolicy, PolicySpec, SCPolicy
from blendserve.core.policies import AllocationPolicy


def _build(name: str, n: int, budget: int, **kwargs: object) -> AllocationPolicy:
    if name == "oracle":
        kwargs["margins"] = [0.05 * (i + 1) for i in range(n)]
    return PolicySpec(name).build(n, budget, **kwargs)


def _answer(rng: random.Random, q: int) -> str | None:
    """Question q answers "right" with probability (q + 1) / (n + 1); sometimes nothing."""
    u = rng.random()
    if u < 0.05:
        return None
    return "right" if u < 0.3 + 0.05 * q else rng.choice(["w1", "w2"])


@pytest.mark.parametrize("name", sorted(POLICIES))
@pytest.mark.parametrize("batch", [1, 3, 8])
def test_budget_is_never_exceeded(name: str, batch: int) -> None:
    rng = random.Random(7)
    n, budget = 7, 61
    policy = _build(name, n, budget, seed=2)
    while chosen := policy.select(batch):
        assert len(chosen) == len(set(chosen)) <= batch
        assert policy.num_dispatched <= budget
        for q in chosen:
            policy.observe(q, _answer(rng, q))
    assert policy.done
    assert sum(policy.num_assigned) == policy.num_dispatched <= budget
    assert sum(policy.votes.num_samples) == policy.num_dispatched
    if not policy.stops_early:  # only a stopping rule (ESC, hedge) may leave budget unspent
        assert policy.num_dispatched == budget


@pytest.mark.parametrize("name", sorted(POLICIES))
def test_cancel_refunds_the_budget(name: str) -> None:
    policy = _build(name, 3, 6)
    chosen = policy.select(3)
    for q in chosen:
        policy.cancel(q)
    assert policy.num_dispatched == 0 and policy.num_pending == 0
    assert sorted(policy.select(3)) == [0, 1, 2]


@pytest.mark.parametrize("name", sorted(POLICIES))
def test_in_flight_question_is_not_selected_twice(name: str) -> None:
    policy = _build(name, 2, 20)
    assert sorted(policy.select(5)) == [0, 1]
    assert policy.select(1) == []
    assert not policy.done
    policy.observe(0, "a")
    assert policy.select(1) == [0]


def test_budget_below_one_sample_per_question() -> None:
    with pytest.raises(ValueError, match="below one sample per question"):
        SCPolicy(5, 4)


def test_sc_spreads_samples_evenly() -> None:
    policy = SCPolicy(4, 4 * 5 + 2, seed=1)
    while chosen := policy.select(1):
        policy.observe(chosen[0], "x")
    assert sorted(policy.num_assigned) == [5, 5, 6, 6]


def test_esc_stops_a_question_on_a_unanimous_window() -> None:
    policy = ESCPolicy(2, 100, window=3)
    while chosen := policy.select(1):
        (q,) = chosen
        k = policy.num_assigned[q]
        # q0 agrees from the start; q1 disagrees in its first window only.
        policy.observe(q, "a" if q == 0 or k > 3 else f"b{k}")
    assert policy.num_assigned == [3, 6]
    assert policy.done and policy.num_remaining == 91


def test_oracle_prefers_the_largest_error_reduction() -> None:
    # exp(-m x)(1 - exp(-m)) for margins 1.0 and 0.1: the small margin wins early,
    # the large one already has little error left after one sample.
    policy = OraclePolicy(2, 10, margins=[1.0, 0.1])
    order = []
    while chosen := policy.select(1):
        order.append(chosen[0])
        policy.observe(chosen[0], "a")
    assert order[:2] == [0, 1]
    assert order.count(1) > order.count(0)


def test_settled_questions_stop_and_the_job_ends_early() -> None:
    policy = PolicySpec.parse("blend").build(3, 300, settle_delta=0.05)
    while chosen := policy.select(1):
        policy.observe(chosen[0], "same")
    assert all(policy.is_settled(q) for q in range(3))
    assert policy.done and policy.num_remaining > 250


@pytest.mark.parametrize(
    "text,name,options",
    [
        ("blend", "blend", {}),
        ("asc:cap=16", "asc", {"cap": 16.0}),
        ("blend:cap=none", "blend", {"cap": None}),
        ("esc:window=8", "esc", {"window": 8}),
    ],
)
def test_policy_spec_parses(text: str, name: str, options: dict[str, object]) -> None:
    spec = PolicySpec.parse(text)
    assert (spec.name, spec.options) == (name, options)
    spec.build(4, 8)


@pytest.mark.parametrize(
    "text,message",
    [
        ("fancy", "unknown policy"),
        ("asc:cap", "bad option"),
        ("asc:speed=3", "bad option"),
        ("asc:cap=big", "bad value"),
        ("asc:window=3", "esc only"),
    ],
)
def test_policy_spec_rejects(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        PolicySpec.parse(text)


def test_an_option_in_the_policy_string_wins_over_the_callers_default() -> None:
    policy = PolicySpec.parse("blend:settle_delta=0.3").build(4, 8, settle_delta=0.0)
    assert policy.settle_log_delta == pytest.approx(math.log(0.3))
    assert PolicySpec.parse("blend").build(4, 8, settle_delta=0.2).settle_log_delta == (
        pytest.approx(math.log(0.2))
    )


@pytest.mark.parametrize("text", ["asc:cap=nan", "blend:cap=1", "blend:settle_delta=nan"])
def test_policy_options_are_checked_when_built(text: str) -> None:
    with pytest.raises(ValueError, match=r"cap|settle_delta"):
        PolicySpec.parse(text).build(4, 8)


def test_pending_samples_rank_as_votes_for_the_leader() -> None:
    policy = ASCPolicy(2, 20, max_in_flight=20)
    assert policy.select(2) == [0, 1]
    policy.observe(0, "a")
    policy.observe(1, "a")
    assert sorted(policy.select(2)) == [0, 1]
    policy.observe(0, "b")  # q0 is split 1:1, q1 agrees 2:0
    policy.observe(1, "a")
    assert policy.rank_state(0) == (1, 1, 2)
    # P[p1 < p2] of q0 with k pending votes for its leader, (1 + k, 1): 0.31, 0.19,
    # 0.11; q1's (2, 0) is 0.125. q0 takes three samples in flight before q1 ranks first.
    picks = [policy.select(1)[0] for _ in range(4)]
    assert picks == [0, 0, 0, 1]
    assert policy.rank_state(0) == (4, 1, 2)
    policy.observe(0, None)  # an abstention drops one virtual vote
    assert policy.rank_state(0) == (3, 1, 2)
    policy.cancel(0)
    assert policy.rank_state(0) == (2, 1, 2)


@pytest.mark.parametrize("name", sorted(POLICIES))
def test_every_question_is_sampled_before_any_is_sampled_twice(name: str) -> None:
    kwargs = {"margins": [0.1] * 5} if name == "oracle" else {}
    policy = POLICIES[name](5, 40, max_in_flight=40, **kwargs)
    picks = [policy.select(1)[0] for _ in range(5)]
    assert sorted(picks) == list(range(5))
    policy.cancel(3)  # a failed first sample: q3 goes first again
    assert policy.select(1) == [3]


@pytest.mark.parametrize("name", sorted(POLICIES))
def test_max_in_flight_lets_a_question_be_chosen_again(name: str) -> None:
    kwargs = {"margins": [0.1, 0.2]} if name == "oracle" else {}
    policy = POLICIES[name](2, 20, max_in_flight=2, **kwargs)
    assert sorted(policy.select(2)) == [0, 1]
    again = policy.select(2)
    assert sorted(again) == [0, 1]
    assert policy.select(1) == []  # both have two in flight
    policy.observe(again[0], "a")
    assert policy.select(1) == [again[0]]
    assert policy.num_open == 2


@pytest.mark.parametrize("name", sorted(POLICIES))
def test_max_in_flight_keeps_each_call_distinct_and_questions_selectable(name: str) -> None:
    kwargs = {"margins": [0.1, 0.2, 0.3]} if name == "oracle" else {}
    policy = POLICIES[name](3, 30, max_in_flight=3, **kwargs)
    assert sorted(policy.select(2)) == [0, 1]
    second = policy.select(3)
    assert len(second) == len(set(second)) == 3
    third = policy.select(3)
    assert len(third) == len(set(third)) == 3  # nobody was lost from the ranking
    assert policy.num_pending == 8
    room = [q for q in range(3) if policy.num_pending_of[q] < 3]
    assert sorted(policy.select(3)) == room
