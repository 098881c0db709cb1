import math

import numpy as np
import pytest
from blendserve.core import DEFAULT_POLICY, HedgePolicy, PolicySpec
from blendserve.core.flatness import Flatness, cap_multiple, floor_share
from blendserve.sim.data import Dataset
from blendserve.sim.runner import run_policy, run_sc
from blendserve.sim.synthetic import synthetic

from tests.support.policies import give_votes


def _run(policy: HedgePolicy, answers: list[list[str]]) -> None:
    """Feeds question q's answers in order (cycling) until the policy stops."""
    while chosen := policy.select(1):
        q = chosen[0]
        seq = answers[q]
        policy.observe(q, seq[(policy.votes.num_samples[q]) % len(seq)])


def test_the_default_is_hedge() -> None:
    assert DEFAULT_POLICY == "hedge"
    assert isinstance(PolicySpec.parse("hedge:floor=0.25,stop=0.01").build(4, 16), HedgePolicy)


def test_floor_share_ramps_from_peaked_to_flat() -> None:
    assert floor_share(0.0) == floor_share(0.2) == 0.0
    assert floor_share(0.35) == pytest.approx(0.25)
    assert floor_share(0.5) == floor_share(0.9) == 0.5
    assert cap_multiple(0.001) is None  # a few contested questions take what they need
    assert cap_multiple(0.1) == pytest.approx(25.0) and cap_multiple(1.0) == 2.5


@pytest.mark.parametrize("rank", ["value", "asc"])
def test_a_peaked_batch_gets_no_floor_and_a_flat_one_half_its_budget(rank: str) -> None:
    peaked = HedgePolicy(4, 4 * 20, rank=rank)
    _run(peaked, [["a"]] * 4)
    assert peaked.disagreement == 0.0 and peaked.floor == 2 and peaked.cap is None
    flat = HedgePolicy(4, 4 * 20, stop=0, rank=rank)
    _run(flat, [["a", "b", "c"]] * 4)
    assert flat.disagreement == 1.0
    # Ranked by the value of a vote, a flat batch needs no floor.
    assert flat.floor == (2 if rank == "value" else 10)
    assert flat.cap == 2.5
    assert flat.num_dispatched == 80  # a flat batch spends its whole budget


def test_ranked_by_value_a_contested_question_goes_before_one_that_looks_sure() -> None:
    policy = HedgePolicy(3, 3 * 40, stop=0)
    # 0 is tied at 2 votes to 2, 1 leads 3 to 1, 2 is unanimous at 4: by the value
    # of a sample, 0 first, then 1.
    votes = [["a", "b", "a", "b"], ["a", "a", "b", "a"], ["a", "a", "a", "a"]]
    give_votes(policy, votes)
    assert policy.select(2) == [0, 1]
    assert policy.select(1) == [2]


def test_a_fixed_floor_holds_for_the_ranking_by_value_too() -> None:
    policy = HedgePolicy(2, 40, floor=0.5, stop=0, rank="value")
    _run(policy, [["a", "b"], ["c"]])
    assert policy.floor == 10
    assert policy.num_assigned[1] >= 10


def test_a_question_below_the_floor_goes_first() -> None:
    policy = HedgePolicy(2, 40, floor=0.5, stop=0)
    # Question 0 is contested, question 1 looks sure after two votes; the floor
    # (10 each) still comes before ASC's ranking would starve question 1.
    answers = [["a", "b"], ["c"]]
    for _ in range(20):
        q = policy.select(1)[0]
        policy.observe(q, answers[q][policy.votes.num_samples[q] % len(answers[q])])
    assert policy.num_assigned == [10, 10]


def test_a_settled_question_stops_and_the_budget_is_a_ceiling() -> None:
    policy = HedgePolicy(3, 600)
    _run(policy, [["x"]] * 3)
    # ASC's P[p1 < p2] of n unanimous votes is 2^-(n+1): at most 1e-3 from 9 on.
    assert policy.num_assigned == [9, 9, 9]
    assert policy.done and policy.num_remaining == 600 - 27
    assert math.isclose(policy.disagreement or 0.0, 0.0)


def test_a_probe_larger_than_the_budget_shrinks() -> None:
    policy = HedgePolicy(5, 5, probe=2)
    assert policy.probe == 1
    _run(policy, [["a", "b"]] * 5)
    assert policy.num_dispatched == 5


@pytest.mark.parametrize(
    "bad", [{"probe": 0}, {"floor": 1.5}, {"stop": 0.5}, {"stop": -1.0}, {"rank": "ppr"}]
)
def test_bad_options_are_refused(bad: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        HedgePolicy(2, 8, **bad)  # type: ignore[arg-type]


def test_hedge_options_apply_to_hedge_only() -> None:
    with pytest.raises(ValueError, match="floor applies to hedge only"):
        PolicySpec.parse("asc:floor=0.5")
    with pytest.raises(ValueError, match="rank applies to hedge only"):
        PolicySpec.parse("asc:rank=value")
    with pytest.raises(ValueError, match="bad value 'ppr' for rank"):
        PolicySpec.parse("hedge:rank=ppr")
    assert PolicySpec.parse("hedge:rank=asc").options == {"rank": "asc"}


def test_flatness_starts_cautious_and_learns() -> None:
    flatness = Flatness(prior=0.5, prior_weight=10)
    assert flatness.share == pytest.approx(floor_share(0.5))
    for _ in range(90):
        flatness.observe(("a", "a"))
    flatness.observe(("a",))  # fewer samples than the probe: not counted
    assert flatness.num_questions == 90
    assert flatness.disagreement == pytest.approx(0.05)
    assert flatness.share == 0.0
    flatness.observe(("a", None))  # an abstention disagrees
    assert flatness.disagreement == pytest.approx(6 / 101)


def _wrong(dataset: Dataset, runs: list[np.ndarray]) -> int:
    return sum(int(r[-1]) for r in runs)


def test_no_regret_on_a_flat_family_at_sc32s_budget() -> None:
    """The default errs no more than SC@32 at SC@32's own budget (fixed seeds, counts)."""
    dataset = synthetic("flat", 300, seed=3)
    n = dataset.num_questions
    spec = PolicySpec(DEFAULT_POLICY)
    seeds = range(4)
    hedge = _wrong(dataset, [run_policy(dataset, spec, 32 * n, s) for s in seeds])
    sc = sum(int(run_sc(dataset, 32, s)[-1]) for s in seeds)
    blend = _wrong(dataset, [run_policy(dataset, PolicySpec("blend"), 32 * n, s) for s in seeds])
    assert hedge <= sc
    assert blend > sc  # what the default guards against: Blend-ASC loses here


def test_a_flat_stream_lowers_its_cap_and_a_peaked_one_keeps_it() -> None:
    flat, peaked = Flatness(), Flatness()
    for _ in range(100):
        flat.observe(("a", "b"))
        peaked.observe(("a", "a"))
    assert flat.cap(16.0) == pytest.approx(2.5 / flat.disagreement)
    assert flat.cap(16.0) < 3.0
    assert peaked.cap(16.0) == 16.0


def test_ranked_by_value_a_long_near_tie_comes_after_questions_worth_a_vote() -> None:
    policy = HedgePolicy(3, 3 * 400, stop=0)
    # 0 leads 100 to 90 and 2 leads 120 to 100 (a few more votes cannot turn either:
    # no value within the look-ahead), 1 leads 3 to 1: ASC orders the long ones.
    counts = [(100, 90), (3, 1), (120, 100)]
    for q, (n1, n2) in enumerate(counts):
        policy.assign(q, n1 + n2)
        for answer in ["a"] * n1 + ["b"] * n2:
            policy.observe(q, answer)
    assert policy.select(3) == [1, 0, 2]
