"""Online pools' metric labels: operator-side values only, few of them, removed with their pools."""

import random
from pathlib import Path

import pytest
from blendserve.engines.replay import ReplayEngine
from blendserve.service.jobs import JobDefaults, JobMaker, JobOptions
from blendserve.service.openai.online import OnlinePools
from blendserve.service.openai.pool_labels import OTHER_MODEL, PoolLabels, pool_label
from blendserve.service.prometheus import PrometheusStats
from blendserve.testing.stats import RecordingStats
from prometheus_client import REGISTRY

DATA = Path(__file__).parents[2] / "fixtures" / "replay_small.jsonl"


@pytest.mark.parametrize(
    ("budget", "aim"),
    [(0.01, "b1"), (1, "b1"), (3, "b4"), (8, "b8"), (8.001, "b16"), (100_000, "b131072")],
)
def test_a_budget_is_rounded_up_to_a_power_of_two(budget: float, aim: str) -> None:
    assert pool_label(None, (), "math", budget) == f"default/math/{aim}"


@pytest.mark.parametrize(
    ("confidence", "aim"), [(0.6, "t1"), (0.9, "t0.1"), (0.95, "t0.1"), (0.99, "t0.01")]
)
def test_a_target_is_rounded_up_to_a_power_of_ten(confidence: float, aim: str) -> None:
    assert pool_label("m", {"m"}, "exact", 8, 1 - confidence) == f"m/exact/{aim}"


def test_only_a_configured_model_names_its_label() -> None:
    assert pool_label("served", {"served"}, "auto", 8) == "served/auto/b8"
    assert pool_label("x" * 512, {"served"}, "auto", 8) == f"{OTHER_MODEL}/auto/b8"
    assert pool_label(None, {"served"}, "auto", 8) == "default/auto/b8"


def test_any_budgets_and_targets_make_few_labels() -> None:
    draw = random.Random(0)
    budgets = {pool_label("m", (), "exact", draw.uniform(0, 100_000)) for _ in range(10_000)}
    budgets |= {pool_label("m", (), "exact", draw.uniform(1, 16)) for _ in range(10_000)}
    targets = {pool_label("m", (), "exact", 8, draw.uniform(1e-16, 0.5)) for _ in range(10_000)}
    assert len(budgets) <= 18 and len(targets) <= 17


def test_a_label_is_released_when_its_last_pool_is() -> None:
    labels = PoolLabels(lambda: {"m"})
    assert (
        labels.label("m", "exact", 3, None) == labels.label("m", "exact", 4, None) == "m/exact/b4"
    )
    labels.hold("m/exact/b4")
    labels.hold("m/exact/b4")
    assert not labels.release("m/exact/b4")
    assert labels.release("m/exact/b4")
    assert not labels.held


def test_dropped_pools_report_their_label_once_no_pool_has_it() -> None:
    sink = RecordingStats()
    maker = JobMaker(ReplayEngine(DATA, sink=sink), JobDefaults())
    pools = OnlinePools(maker, max_pools=2, models=lambda: {"served"})
    exact = JobOptions(answer_kind="exact", model="served")
    first = pools.pool(exact, 3)
    second = pools.pool(exact, 4)  # its own pool, the first's label
    third = pools.pool(JobOptions(answer_kind="exact", model="anything"), 9)
    assert [first.name, second.name, third.name] == [
        "served/exact/b4",
        "served/exact/b4",
        "other/exact/b16",
    ]
    assert not sink.of("pool_dropped")  # the first pool went, not its label
    pools.pool(exact, 5)  # the second pool goes: its label with it
    assert sink.of("pool_dropped") == [("served/exact/b4",)]
    assert dict(pools.labels.held) == {"other/exact/b16": 1, "served/exact/b8": 1}


def _pool_series(label: str) -> list[str]:
    return [
        sample.name
        for family in REGISTRY.collect()
        for sample in family.samples
        if sample.labels.get("pool") == label
    ]


def test_a_dropped_label_leaves_no_series() -> None:
    label = "test-dropped/exact/b8"
    sink = PrometheusStats()
    sink.pool_answered(label, 2, 0.1, 3.0, -0.1)
    assert len(_pool_series(label)) == 19
    sink.pool_dropped(label)
    sink.pool_dropped(label)  # twice: nothing left to remove
    assert _pool_series(label) == []
