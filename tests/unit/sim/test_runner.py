import numpy as np
from blendserve.core import PolicySpec
from blendserve.sim import run_policy, synthetic
from blendserve.sim.efficiency import sample_efficiency
from blendserve.sim.runner import AnswerDraws, run_sc


def test_same_seed_same_run() -> None:
    data = synthetic("llm", 60, seed=2)
    spec = PolicySpec.parse("blend")
    first = run_policy(data, spec, 60 * 8, seed=5)
    np.testing.assert_array_equal(first, run_policy(data, spec, 60 * 8, seed=5))
    assert not np.array_equal(first, run_policy(data, spec, 60 * 8, seed=6))


def test_draws_follow_the_distribution() -> None:
    data = synthetic("d1", 5, seed=0)
    draws = AnswerDraws(data, seed=3)
    counts = np.bincount([draws.next(0) for _ in range(20_000)], minlength=len(data.probs[0]))
    np.testing.assert_allclose(counts / 20_000, data.probs[0], atol=0.015)


def test_direct_sc_equals_the_sc_policy_at_whole_budgets() -> None:
    data = synthetic("llm", 40, seed=4)
    by_policy = run_policy(data, PolicySpec.parse("sc"), 40 * 6, seed=1)
    direct = run_sc(data, 6, seed=1)
    np.testing.assert_array_equal(by_policy[40 - 1 :: 40], direct)


def test_adaptive_policies_need_fewer_samples_than_sc() -> None:
    data = synthetic("llm", 400, seed=11)
    (row,) = sample_efficiency(data, [16], ["sc", "asc", "blend"], reps=4, seed=0)
    assert row.sc_error > 0
    assert row.methods["sc"].samples == 16
    for method in ("asc", "blend"):
        result = row.methods[method]
        assert result.reached
        assert result.samples < 16 * 0.8, (method, result)
