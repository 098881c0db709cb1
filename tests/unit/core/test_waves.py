"""The wave plan: a batch's budget split into a few waves per question."""

import math

import numpy as np
import pytest
from blendserve.core.policies import HedgePolicy, PolicySpec
from blendserve.core.waves import (
    MIN_REACH,
    WIDE_MAX_ROUNDS,
    WavePlan,
    expected_log_uncertainty,
)
from blendserve.core.worth import VoteWorth
from blendserve.sim.runner import run_sc
from blendserve.sim.synthetic import synthetic
from blendserve.sim.waves import run_waves
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.support.policies import give_votes

_STATE = st.tuples(st.integers(0, 20), st.integers(0, 20), st.integers(0, 10)).map(
    lambda t: (max(t[0], t[1]), min(t[0], t[1]), max(t[0], t[1]) + min(t[0], t[1]) + t[2])
)


def test_the_first_wave_is_a_share_of_the_budget_and_at_least_the_probe() -> None:
    plan = WavePlan(first_share=0.35)
    assert plan.first_wave(20) == 7
    assert plan.first_wave(3) == 2  # the probe: flatness is known after it
    assert plan.first_wave(1.5) == 1  # never past the budget
    assert WavePlan(max_rounds=1).first_wave(8.7) == 8  # one round: all of it


def test_a_plan_of_two_or_three_rounds_sends_half_the_budget_first() -> None:
    assert WavePlan(max_rounds=4).first_wave(20) == 7
    assert WavePlan(max_rounds=3).first_wave(20) == WavePlan(max_rounds=2).first_wave(20) == 10
    assert WavePlan(max_rounds=2, first_share=0.35).first_wave(20) == 7  # asked for: kept
    # A widened plan sends the first wave of the plan it widens.
    assert WavePlan(max_rounds=4).widened().first_wave(20) == 7
    assert WavePlan(max_rounds=3).widened().first_wave(20) == 10


def test_a_widened_plan_has_a_round_fewer_and_grows_a_question_further() -> None:
    plan = WavePlan(max_rounds=4)
    wide = plan.widened()
    assert wide.max_rounds == WIDE_MAX_ROUNDS == 3
    assert WavePlan(max_rounds=2).widened().max_rounds == 2  # never more than asked
    assert plan.reach(4, 1) == 8 and wide.reach(4, 1) == 12  # a wave may triple, not double
    # A contested question's next wave is bounded by its growth.
    assert plan.wave(3, 3, 6, -10.0, limit=100, rounds_left=2) == 6
    assert wide.wave(3, 3, 6, -10.0, limit=100, rounds_left=2) > 6


def test_a_plan_of_few_rounds_lets_a_question_grow_min_reach_times_its_first_wave() -> None:
    assert WavePlan(max_rounds=3).reach(4, 2) == 4 * MIN_REACH  # three rounds: waves double
    assert WavePlan(max_rounds=2).reach(4, 1) == 4 * MIN_REACH  # its one wave after the first


def test_two_rounds_spend_a_flat_batchs_budget() -> None:
    dataset = synthetic("flat", 64, seed=2)
    # The first wave of 4 rounds, where doubling once after it spent 0.7 of the budget.
    plan = WavePlan(max_rounds=2, first_share=0.35)
    run = run_waves(dataset, PolicySpec("hedge"), 64 * 16, seed=0, plan=plan)
    assert run.waves == 2
    assert run.spent >= 0.95 * 64 * 16


def test_a_unanimous_question_is_expected_surer_than_a_contested_one() -> None:
    assert expected_log_uncertainty(6, 0, 6, 4) < expected_log_uncertainty(4, 2, 6, 4)
    # more samples, surer; a tie is never expected to resolve
    assert expected_log_uncertainty(4, 1, 5, 8) < expected_log_uncertainty(4, 1, 5, 2)
    assert expected_log_uncertainty(3, 3, 6, 30) == pytest.approx(math.log(0.5))


@settings(max_examples=80, deadline=None)
@given(
    states=st.lists(_STATE, min_size=1, max_size=12),
    budget=st.integers(0, 200),
    cap=st.integers(1, 60),
    floor=st.integers(0, 6),
)
def test_allocate_never_plans_beyond_the_budget_or_a_cap(
    states: list[tuple[int, int, int]], budget: int, cap: int, floor: int
) -> None:
    limits = [max(0, cap - n) for _, _, n in states]
    floors = [max(0, floor - n) for _, _, n in states]
    needs, _ = WavePlan().allocate(states, [0] * len(states), limits, floors, budget)
    assert all(0 <= need <= limit for need, limit in zip(needs, limits, strict=True))
    assert sum(needs) <= max(
        budget, sum(min(f, lim) for f, lim in zip(floors, limits, strict=True))
    )


def test_the_budget_goes_to_the_least_sure_questions_first() -> None:
    states = [(10, 0, 10), (3, 2, 5), (5, 0, 5)]
    needs, log_price = WavePlan().allocate(states, [0, 0, 0], [40, 40, 40], [0, 0, 0], 10)
    assert needs[1] == max(needs) and needs[0] == 0
    assert log_price > math.log(1e-3)


def test_only_a_last_wave_sends_all_a_question_needs() -> None:
    plan = WavePlan(max_rounds=4)
    assert plan.step(30, 4, 2, 6, math.log(0.01), rounds_left=1) == 30
    assert plan.step(30, 4, 2, 6, math.log(0.01), rounds_left=3) < 30


def test_a_wave_run_takes_at_most_max_rounds_and_never_passes_its_budget() -> None:
    dataset = synthetic("llm", 64, seed=3)
    for rounds in (1, 2, 4):
        run = run_waves(dataset, PolicySpec("hedge"), 640, seed=0, plan=WavePlan(max_rounds=rounds))
        assert run.waves <= rounds and run.rounds.max() <= rounds
        assert 64 <= run.spent <= 640


def test_waves_keep_most_of_the_sequential_saving_on_an_llm_like_family() -> None:
    """At 10 samples a question the wave plan errs less than uniform sampling at 16."""
    dataset = synthetic("llm", 320, seed=5)
    waves = sum(run_waves(dataset, PolicySpec("hedge"), 3200, seed=s).num_wrong for s in range(3))
    uniform = sum(int(run_sc(dataset, 16, s)[-1]) for s in range(3))
    assert waves < uniform


def test_allocate_spends_on_the_rows_it_is_given() -> None:
    rows = [np.log([0.5, 0.4, 0.1]), np.log([0.3, 0.2, 0.05])]
    needs, log_price = WavePlan().allocate([(1, 0, 1)] * 2, [0, 0], [3, 3], [0, 0], 3, rows=rows)
    assert needs == [2, 1] and log_price == pytest.approx(math.log(0.2))


def test_a_wave_planned_by_value_stops_where_asc_expects_the_question_settled() -> None:
    """A batch's budget is a ceiling with waves ranked by value too: unanimous questions
    are bought no more than ASC expects them to need to reach the stop."""
    policy = HedgePolicy(4, 4 * 60)
    plan = WavePlan()
    for q in range(4):
        policy.assign(q, 3)
        for _ in range(3):
            policy.observe(q, "a")
    waves = policy.plan_waves(plan, [1] * 4)
    # ASC's P[p1 < p2] of n unanimous votes is 2^-(n+1): at most 1e-3 from 9 votes on.
    assert waves and all(1 <= k <= 6 for k in waves.values())


def test_a_flat_batch_planned_by_value_sends_its_contested_questions_more() -> None:
    policy = HedgePolicy(3, 3 * 30, stop=0)
    votes = [["a", "b", "a", "b"], ["a", "a", "a", "b"], ["a", "a", "a", "a"]]
    give_votes(policy, votes)
    waves = policy.plan_waves(WavePlan(), [1, 1, 1])
    assert waves[0] >= waves[1] >= waves[2] >= 1
    assert sum(waves.values()) <= policy.num_remaining


def test_value_gains_fall_and_start_at_the_value_of_a_sample() -> None:
    value = VoteWorth()
    gains = value.log_gains(3, 1, 0.8, 40)
    assert len(gains) == 40 and np.all(np.diff(gains) <= 0)
    assert gains[0] == pytest.approx(math.log(0.8 * value.worth(3, 1)))
    assert value.log_gains(9, 0, 1.0, 10)[0] < value.log_gains(5, 4, 1.0, 10)[0]
