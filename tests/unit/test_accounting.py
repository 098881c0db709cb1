"""The accounting check of the fault tests catches samples that never ended, or ended twice."""

from __future__ import annotations

import pytest
from blendserve.testing import fake_openai
from blendserve.testing.accounting import assert_accounting, parse_accounting
from blendserve.testing.stats import RecordingStats

UP, OTHER = "http://up:1/v1", "http://other:2/v1"


def _exposition(samples: dict[tuple[str, str], float], in_flight: float) -> str:
    lines = [
        "# HELP blendserve_in_flight_samples Samples requested from the engine and not yet back.",
        "# TYPE blendserve_in_flight_samples gauge",
        f"blendserve_in_flight_samples {in_flight}",
        "# HELP blendserve_upstream_samples Samples by upstream and outcome.",
        "# TYPE blendserve_upstream_samples counter",
    ]
    for (upstream, outcome), count in samples.items():
        labels = f'upstream="{upstream}",outcome="{outcome}"'
        lines.append(f"blendserve_upstream_samples_total{{{labels}}} {count}")
        lines.append(f"blendserve_upstream_samples_created{{{labels}}} 1.7e9")
    return "\n".join(lines) + "\n"


def _balanced(upstream: str) -> dict[tuple[str, str], float]:
    return {
        (upstream, "dispatched"): 10,
        (upstream, "completed"): 6,
        (upstream, "failed"): 3,
        (upstream, "cancelled"): 1,
    }


def test_a_balanced_exposition_holds() -> None:
    accounting = parse_accounting(_exposition({**_balanced(UP), **_balanced(OTHER)}, 0))
    assert accounting.holds()
    assert accounting.total("dispatched") == 20 and accounting.gaps() == {UP: 0, OTHER: 0}


@pytest.mark.parametrize(
    ("change", "in_flight", "gap"),
    [
        ({(UP, "completed"): 5}, 0, 1),  # a sample dispatched that never ended
        ({(UP, "failed"): 4}, 0, -1),  # a sample that ended twice
        ({}, 2, 0),  # samples still in flight
    ],
)
def test_a_gap_or_samples_in_flight_do_not_hold(
    change: dict[tuple[str, str], float], in_flight: float, gap: float
) -> None:
    accounting = parse_accounting(_exposition({**_balanced(UP), **change}, in_flight))
    assert not accounting.holds()
    assert accounting.gaps() == {UP: gap}


def test_only_the_upstreams_asked_for_are_checked() -> None:
    text = _exposition({**_balanced(UP), (OTHER, "dispatched"): 4}, 0)
    assert not parse_accounting(text).holds()
    assert parse_accounting(text, [UP]).holds()
    assert parse_accounting(text, ["http://unused/v1"]).gaps() == {"http://unused/v1": 0}


def test_assert_accounting_fails_with_the_numbers_after_its_deadline() -> None:
    stats = RecordingStats()
    stats.upstream_samples(UP, "dispatched", 4)
    stats.upstream_samples(UP, "completed", 3)
    with pytest.raises(
        AssertionError, match=r"dispatched 4, completed 3.*gaps \{'http://up:1/v1': 1"
    ):
        assert_accounting(stats, timeout=0.05)
    stats.upstream_samples(UP, "cancelled", 1)
    assert assert_accounting(stats, timeout=0.05).total("cancelled") == 1


def test_metrics_without_the_in_flight_gauge_are_an_error() -> None:
    with pytest.raises(AssertionError, match="no blendserve_in_flight_samples"):
        parse_accounting("")


def test_a_fake_upstream_never_takes_a_port_an_earlier_fake_had(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The service's metrics are process-wide, by upstream URL: an earlier fake's
    # port would bring its counts along. The OS is made to offer one first.
    first = fake_openai.FakeServer().start()
    first.stop()
    offered = [first.port]
    real_bind = fake_openai._bind
    monkeypatch.setattr(
        fake_openai, "_bind", lambda port: real_bind(offered.pop() if offered else port)
    )
    second = fake_openai.FakeServer().start()
    try:
        assert not offered  # the earlier port was offered, and refused
        assert second.port != first.port
    finally:
        second.stop()
