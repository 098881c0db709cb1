"""The upstream sample accounting: dispatched = completed + failed + cancelled + in flight.

Every sample an engine asks of an upstream is counted ``dispatched``, then once
more with its outcome (``blendserve_upstream_samples_total{upstream, outcome}``);
``blendserve_in_flight_samples`` counts the samples asked of the engine and not
back yet. Per upstream, what is dispatched and not ended is in flight, and no
metric counts an upstream's share of the in-flight gauge on its own (a sample
waiting for its retry is in flight but at no upstream). So the identity is
checked once the service has settled: nothing in flight and, per upstream,
dispatched = completed + failed + cancelled. :func:`assert_accounting` polls
for that with a deadline and fails with the numbers when it never comes (a
sample dispatched that never ended, or one ended twice).

Used by the fault tests and by ``python -m bench.load.abuse``.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import httpx
from prometheus_client.parser import text_string_to_metric_families

from blendserve.service.metrics import UPSTREAM_OUTCOMES
from blendserve.testing.stats import RecordingStats

__all__ = [
    "Accounting",
    "assert_accounting",
    "parse_accounting",
    "read_accounting",
    "recorded_accounting",
    "settle_accounting",
]

SAMPLES = "blendserve_upstream_samples_total"
IN_FLIGHT = "blendserve_in_flight_samples"


@dataclass(frozen=True)
class Accounting:
    """Samples per upstream and outcome, and the samples in flight, at one reading."""

    samples: Mapping[str, Mapping[str, float]]
    in_flight: float

    def gaps(self) -> dict[str, float]:
        """Per upstream: dispatched minus completed, failed and cancelled."""
        return {
            upstream: outcomes.get("dispatched", 0.0)
            - sum(outcomes.get(o, 0.0) for o in UPSTREAM_OUTCOMES if o != "dispatched")
            for upstream, outcomes in self.samples.items()
        }

    def holds(self) -> bool:
        """True once settled: nothing in flight and no upstream with a gap."""
        return self.in_flight == 0 and not any(self.gaps().values())

    def total(self, outcome: str) -> float:
        """Samples of ``outcome`` over every upstream."""
        return sum(outcomes.get(outcome, 0.0) for outcomes in self.samples.values())

    def describe(self) -> str:
        """One line: the totals by outcome, the samples in flight and any upstream's gap."""
        totals = ", ".join(f"{o} {self.total(o):g}" for o in UPSTREAM_OUTCOMES)
        gaps = {upstream: gap for upstream, gap in self.gaps().items() if gap}
        return f"{totals}, in flight {self.in_flight:g}" + (f"; gaps {gaps}" if gaps else "")


def _wanted(upstream: str, upstreams: frozenset[str] | None) -> bool:
    return upstreams is None or upstream in upstreams


def parse_accounting(text: str, upstreams: Iterable[str] | None = None) -> Accounting:
    """The accounting of a ``/metrics`` exposition, of ``upstreams`` only when given."""
    chosen = None if upstreams is None else frozenset(upstreams)
    samples: dict[str, dict[str, float]] = {}
    in_flight: float | None = None
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == IN_FLIGHT:
                in_flight = sample.value
            elif sample.name == SAMPLES and _wanted(sample.labels["upstream"], chosen):
                outcomes = samples.setdefault(sample.labels["upstream"], {})
                outcome = sample.labels["outcome"]
                outcomes[outcome] = outcomes.get(outcome, 0.0) + sample.value
    if in_flight is None:
        raise AssertionError(f"no {IN_FLIGHT} in the metrics")
    for upstream in chosen or ():
        samples.setdefault(upstream, {})
    return Accounting(samples, in_flight)


def recorded_accounting(
    stats: RecordingStats, upstreams: Iterable[str] | None = None
) -> Accounting:
    """The accounting of what a :class:`RecordingStats` sink was told (an engine alone)."""
    chosen = None if upstreams is None else frozenset(upstreams)
    samples: dict[str, dict[str, float]] = {upstream: {} for upstream in chosen or ()}
    for upstream, outcome, count in stats.of("upstream_samples"):
        if _wanted(upstream, chosen):
            outcomes = samples.setdefault(upstream, {})
            outcomes[outcome] = outcomes.get(outcome, 0.0) + count
    return Accounting(samples, float(stats.level("in_flight")))


def read_accounting(
    source: str | RecordingStats, upstreams: Iterable[str] | None = None
) -> Accounting:
    """The accounting now, from a server's ``/metrics`` (its base URL) or a recording sink."""
    if isinstance(source, RecordingStats):
        return recorded_accounting(source, upstreams)
    response = httpx.get(f"{source}/metrics", timeout=30)
    if response.status_code != 200:
        raise AssertionError(f"/metrics answered {response.status_code}: {response.text[:200]}")
    return parse_accounting(response.text, upstreams)


def settle_accounting(
    source: str | RecordingStats, upstreams: Iterable[str] | None = None, timeout: float = 10.0
) -> tuple[Accounting, float]:
    """Polls until the accounting holds or ``timeout`` passed: the last reading, and the seconds.

    The caller decides what a reading that never held means (see :func:`assert_accounting`).
    """
    chosen = None if upstreams is None else tuple(upstreams)
    start = time.monotonic()
    while True:
        accounting = read_accounting(source, chosen)
        waited = time.monotonic() - start
        if accounting.holds() or waited > timeout:
            return accounting, waited
        time.sleep(0.02)


def assert_accounting(
    source: str | RecordingStats, upstreams: Iterable[str] | None = None, timeout: float = 10.0
) -> Accounting:
    """Fails unless every dispatched sample ended once, polled for until ``timeout``.

    Args:
        source: a live server's base URL (its ``/metrics``), or the sink an engine reported to.
        upstreams: the upstream labels to check (None: every one in the metrics).
        timeout: seconds the samples still in flight get to end.
    """
    accounting, waited = settle_accounting(source, upstreams, timeout)
    if not accounting.holds():
        raise AssertionError(
            "upstream samples unaccounted for after "
            f"{waited:.1f} s (dispatched = completed + failed + cancelled + in flight): "
            + accounting.describe()
        )
    return accounting
