"""The online method in the simulator: a stream of questions, paced to a budget."""

import numpy as np
import pytest
from blendserve.core.online_rule import OnlineRule
from blendserve.sim import sample_efficiency, synthetic
from blendserve.sim.online import run_online


# About 30 s alone; four times that beside another test worker's numpy on 2 cores.
@pytest.mark.timeout(480)
def test_the_stream_spends_the_budget_and_beats_sc_at_that_spend() -> None:
    dataset = synthetic("llm", 400, seed=0)
    run = run_online(dataset, OnlineRule(), 6.0, seed=0)
    assert run.samples.mean() == pytest.approx(6.0, rel=0.05)
    assert abs(run.running_mean()[199] / 6.0 - 1) < 0.15
    assert run.rounds.min() >= 1 and np.median(run.rounds) <= 3
    rows = sample_efficiency(dataset, [8], ["sc", "online"], reps=4, jobs=1)
    online = rows[0].methods["online"]
    assert online.reached and online.ratio > 1.5


def test_a_quality_target_spends_more_when_stricter() -> None:
    dataset = synthetic("llm", 200, seed=1)
    loose = run_online(dataset, OnlineRule(target=0.1), 8.0, seed=0)
    strict = run_online(dataset, OnlineRule(target=0.001), 8.0, seed=0)
    assert strict.samples.mean() > loose.samples.mean()
    assert strict.num_wrong <= loose.num_wrong


def test_same_seed_same_run() -> None:
    dataset = synthetic("d1", 100, seed=2)
    a, b = (run_online(dataset, OnlineRule(score="ppr"), 4.0, seed=5) for _ in range(2))
    assert a.num_wrong == b.num_wrong and (a.samples == b.samples).all()


def test_waves_learned_from_the_stream_err_less_than_waves_sized_by_asc_on_flat_answers() -> None:
    dataset = synthetic("flat", 600, seed=7)
    learned, by_asc = (
        [run_online(dataset, OnlineRule.parse(spec), 20.0, seed) for seed in range(3)]
        for spec in ("online", "online:plan=asc")
    )
    for runs in (learned, by_asc):
        assert all(np.percentile(r.rounds, 95) <= 4 for r in runs)
        assert np.mean([r.samples.mean() for r in runs]) == pytest.approx(20.0, rel=0.05)
    assert sum(r.num_wrong for r in learned) < sum(r.num_wrong for r in by_asc)


def test_only_a_paced_bounded_asc_rule_is_planned_by_the_prior() -> None:
    assert OnlineRule().planned
    assert not any(
        OnlineRule.parse(spec).planned
        for spec in ("online:plan=asc", "online:rounds=0", "online:score=ppr", "online:target=0.01")
    )


@pytest.mark.parametrize(
    "text", ["online:score=x", "online:cap=0.5", "online:target=2", "online:plan=x", "asc"]
)
def test_bad_specs_are_refused(text: str) -> None:
    with pytest.raises(ValueError):
        OnlineRule.parse(text)
