"""The wave plan: a batch's budget split into a few waves per question."""

import math

import pytest
from blendserve.core.policies import PolicySpec
from blendserve.core.waves import WavePlan, expected_log_uncertainty
from blendserve.sim.runner import run_sc
from blendserve.sim.synthetic import synthetic
from blendserve.sim.waves import run_waves
from hypothesis import given, settings
from hypothesis import strategies as st

_STATE = st.tuples(st.integers(0, 20), st.integers(0, 20), st.integers(0, 10)).map(
    lambda t: (max(t[0], t[1]), min(t[0], t[1]), max(t[0], t[1]) + min(t[0], t[1]) + t[2])
)


def test_the_first_wave_is_a_share_of_the_budget_and_at_least_the_probe() -> None:
    plan = WavePlan(first_share=0.35)
    assert plan.first_wave(20) == 7
    assert plan.first_wave(3) == 2  # the probe: flatness is known after it
    assert plan.first_wave(1.5) == 1  # never past the budget
    assert WavePlan(max_rounds=1).first_wave(8.7) == 8  # one round: all of it


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
    needs, log_tau = WavePlan().allocate(states, [0, 0, 0], [40, 40, 40], [0, 0, 0], 10)
    assert needs[1] == max(needs) and needs[0] == 0
    assert log_tau > math.log(1e-3)


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
