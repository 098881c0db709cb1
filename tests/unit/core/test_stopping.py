"""The online stopping rule, its waves, and the pacing of tau."""

import math
import random

import pytest
from blendserve.core.price import PacedPrice, first_log_price
from blendserve.core.programme import VotePrior
from blendserve.core.stopping import StoppingRule
from blendserve.core.uncertainty import asc_log_uncertainty
from blendserve.core.votes import VoteState


def test_a_question_stops_at_tau_or_at_its_cap() -> None:
    rule = StoppingRule("asc", max_num_samples=10)
    log_price = math.log(0.03)
    # Unanimous: P[p1 < p2] = 2^-(n+1), at most 0.03 from n = 5 on.
    assert not rule.is_done(4, 0, 1, 4, log_price)
    assert rule.is_done(5, 0, 1, 5, log_price)
    assert not rule.is_done(5, 4, 2, 9, log_price)
    assert rule.is_done(5, 5, 2, 10, log_price)  # the cap
    assert not rule.is_done(0, 0, 0, 3, 0.0)  # no vote yet: never confident


def test_waves_stop_exactly_where_one_at_a_time_sampling_would() -> None:
    rule = StoppingRule("asc", max_num_samples=40)
    rng = random.Random(0)
    for log_price in (math.log(0.1), math.log(0.02), math.log(1e-4)):
        for _ in range(200):
            p = rng.choice([0.95, 0.7, 0.5])
            stream = [0 if rng.random() < p else rng.randrange(1, 3) for _ in range(40)]
            one = VoteState(1)
            for key in stream:  # one at a time
                if rule.is_done(*one.state(0), one.num_samples[0], log_price):
                    break
                one.add(0, key)
            waves = VoteState(1)
            while m := rule.wave_size(*waves.state(0), waves.num_samples[0], log_price):
                for key in stream[waves.num_samples[0] : waves.num_samples[0] + m]:
                    waves.add(0, key)
            assert waves.num_samples[0] == one.num_samples[0]


def test_a_first_wave_is_the_least_a_unanimous_question_needs() -> None:
    rule = StoppingRule("asc", max_num_samples=64)
    log_price = math.log(0.03)
    first = rule.wave_size(0, 0, 0, 0, log_price)
    assert asc_log_uncertainty(first, 0) <= log_price < asc_log_uncertainty(first - 1, 0)
    assert StoppingRule("asc", 64, min_growth=1.0).wave_size(3, 2, 2, 5, log_price) >= 5


def test_the_cap_is_a_multiple_of_the_budget_and_bounded_beyond_it() -> None:
    assert StoppingRule.for_budget(8).max_num_samples == 56
    assert StoppingRule.for_budget(30).max_num_samples == 78
    assert StoppingRule.for_budget(2).max_num_samples == 32
    assert StoppingRule.for_budget(3, cap=2).max_num_samples == 6


def test_the_first_wave_is_a_share_of_the_budget_and_top_ups_are_the_least() -> None:
    rule = StoppingRule.for_budget(20)
    log_price = math.log(0.03)  # a unanimous question could stop after 5 samples
    assert rule.wave_size(0, 0, 0, 0, log_price) == 10
    assert rule.wave_size(6, 4, 2, 10, log_price) == StoppingRule(
        "asc", rule.max_num_samples
    ).samples_to_stop(6, 4, 2, 10, log_price)
    assert StoppingRule.for_budget(20, first_share=0).wave_size(0, 0, 0, 0, log_price) == 5


def test_open_questions_past_the_budget_count_in_the_debt_until_they_end() -> None:
    pace = PacedPrice(8)
    start = pace.log_price
    pace.spend(0, 6)
    assert pace.debt == 0 and pace.log_price == start
    pace.spend(6, 20)
    assert pace.debt == 12 and pace.log_price > start
    pace.close(20)  # its caller left: it is not paced
    assert pace.debt == 0 and pace.num_questions == 0
    pace.spend(0, 20)
    pace.close(20)
    pace.observe(20)
    assert pace.debt == 12 and pace.num_questions == 1


def test_pacing_meets_the_budget_with_many_questions_open() -> None:
    rng = random.Random(2)
    rule = StoppingRule.for_budget(6)
    pace = PacedPrice(6)
    open_votes: list[VoteState] = []
    started = 0
    while pace.num_questions < 200:
        while len(open_votes) < 32 and started < 400:  # 32 questions in flight
            open_votes.append(VoteState(1))
            started += 1
        votes = open_votes[rng.randrange(len(open_votes))]
        n = votes.num_samples[0]
        p = [0.95, 0.95, 0.95, 0.8, 0.6, 0.45][id(votes) % 6]
        if rule.is_done(*votes.state(0), n, pace.log_price):
            pace.close(n)
            pace.observe(n)
            open_votes.remove(votes)
            continue
        votes.add(0, 0 if rng.random() < p else rng.randrange(1, 4))
        pace.spend(n, n + 1)
    assert abs(pace.pacing_error) < 0.15


def test_pacing_meets_the_budget_from_a_cold_start() -> None:
    rng = random.Random(1)
    rule = StoppingRule.for_budget(6)
    pace = PacedPrice(6)
    for _ in range(300):
        votes = VoteState(1)
        p = rng.choice([0.95, 0.95, 0.95, 0.8, 0.6, 0.45])
        while not rule.is_done(*votes.state(0), votes.num_samples[0], pace.log_price):
            votes.add(0, 0 if rng.random() < p else rng.randrange(1, 4))
        pace.observe(votes.num_samples[0])
    assert abs(pace.pacing_error) < 0.15
    assert pace.mean_samples == pytest.approx(6, rel=0.15)


def test_tau_rises_when_questions_overspend_and_falls_when_they_underspend() -> None:
    high, low = PacedPrice(8), PacedPrice(8)
    start = high.log_price
    for _ in range(10):
        high.observe(20)
        low.observe(2)
    assert high.log_price > start > low.log_price
    assert high.debt == 120 and low.debt == -60


def test_a_quality_target_is_a_fixed_price() -> None:
    fixed = PacedPrice(None, log_price=math.log(0.01))
    fixed.observe(50)
    assert fixed.price == pytest.approx(0.01) and fixed.pacing_error == 0 and not fixed.paced


def test_the_start_threshold_falls_with_the_budget() -> None:
    values = [first_log_price(b) for b in (1, 2, 5, 8, 20, 64, 1000)]
    assert values == sorted(values, reverse=True)
    assert all(math.log(1e-12) <= v < 0 for v in values)


@pytest.mark.parametrize(
    "make",
    [
        lambda: StoppingRule("bogus"),  # type: ignore[arg-type]
        lambda: StoppingRule("asc", 0),
        lambda: StoppingRule("asc", 8, min_first=-1),
        lambda: PacedPrice(0.5),
        lambda: PacedPrice(None),
        lambda: PacedPrice(8, log_price=1.0e3),
    ],
)
def test_bad_settings_are_refused(make: object) -> None:
    with pytest.raises(ValueError):
        make()  # type: ignore[operator]


def test_a_learned_prior_sizes_the_waves_within_the_cap_and_the_rounds() -> None:
    rule = StoppingRule("asc", max_num_samples=12, max_rounds=2, prior=VotePrior())
    log_price = -9.0  # cheap votes: the programme would buy more than the cap leaves
    assert 0 < rule.wave_size(0, 0, 0, 0, log_price) <= 12
    assert rule.wave_size(3, 3, 2, 9, log_price, rounds=1) == 3  # what the cap leaves
    assert rule.wave_size(3, 3, 2, 6, log_price, rounds=2) == 0  # no round left
    assert not rule.is_done(3, 3, 2, 6, log_price) and rule.is_done(12, 0, 1, 12, -2.0)
    # Votes priced past their worth: the programme stops at once, but a question never
    # goes without a sample (its answer would be none).
    assert VotePrior().wave(0, 0, 0, -0.5, 2) == 0
    assert rule.wave_size(0, 0, 0, 0, -0.5) == 1 and rule.wave_size(1, 0, 1, 1, -0.5) == 0
    for unplanned in ({"max_rounds": 0}, {"max_rounds": 2, "score": "ppr"}):
        with pytest.raises(ValueError):
            StoppingRule(max_num_samples=12, prior=VotePrior(), **unplanned)


@pytest.mark.parametrize(
    ("n1", "n2", "running", "done"),
    [
        (6, 0, 2, True),  # even 6:2 is below 0.1
        (5, 0, 2, False),  # 5:0 is, but 5:2 is not: the wave's end could undo the stop
        (1, 0, 4, False),  # the samples still running could make another answer lead
    ],
)
def test_a_wave_is_cut_only_when_its_end_could_not_undo_the_stop(
    n1: int, n2: int, running: int, done: bool
) -> None:
    rule = StoppingRule("asc", 64)
    log_price = math.log(0.1)
    assert rule.is_done(n1, n2, 2, 0, log_price) is (n1 > 1)
    assert rule.is_done_whatever_comes(n1, n2, 2, running, log_price) is done
    # With a learned prior too, a leader the running samples could overtake is never done.
    prior_rule = StoppingRule("asc", 64, max_rounds=4, prior=VotePrior())
    assert not prior_rule.is_done_whatever_comes(1, 0, 1, 4, log_price)
