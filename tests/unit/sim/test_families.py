import numpy as np
import pytest
from blendserve.core import DEFAULT_POLICY, PolicySpec
from blendserve.sim.efficiency import is_budget_aware, parse_policy
from blendserve.sim.synthetic import FAMILIES, synthetic


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_every_family_draws_distributions_with_a_unique_mode(family: str) -> None:
    dataset = synthetic(family, 200, seed=1)
    assert dataset.num_questions + dataset.num_dropped == 200
    for p in dataset.probs:
        assert np.isclose(p.sum(), 1.0) and (len(p) == 1 or p[0] > p[1])
        assert np.all(np.diff(p) <= 1e-12)  # descending


def _disagreement(family: str) -> float:
    return float(np.mean([1.0 - (p**2).sum() for p in synthetic(family, 500, seed=0).probs]))


def test_the_flat_families_are_flatter_than_the_llm_like_one() -> None:
    assert _disagreement("llm") < 0.35
    assert all(_disagreement(f) > 0.45 for f in ("flat", "many", "ties", "mixed"))
    assert _disagreement("many") > _disagreement("flat")


def test_default_names_what_solve_runs() -> None:
    assert parse_policy("default") == PolicySpec(DEFAULT_POLICY)
    assert parse_policy("default:floor=0") == PolicySpec.parse(f"{DEFAULT_POLICY}:floor=0")
    assert parse_policy("asc:cap=16") == PolicySpec.parse("asc:cap=16")
    assert is_budget_aware("default") and is_budget_aware("blend")
    assert not is_budget_aware("asc")
