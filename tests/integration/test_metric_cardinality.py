"""Clients cannot mint metric series, and a scrape does not hold the event loop.

A real uvicorn server on loopback over the replay engine (zero latency), with
an engine that lists no model and aliases allowed, so that every ``model`` a
client names goes through to the pool: a flood of ``/v1`` requests, each with
a long model name and a budget of its own (a pool each), and of requests to
paths no route has, leaves ``/metrics`` bounded.
"""

from __future__ import annotations

import asyncio
import threading
from collections import Counter
from collections.abc import Iterable, Iterator
from contextlib import contextmanager

import httpx
import pytest
from blendserve.testing.abuse import FLOOD_MARK, FLOOD_RECORDS, Unlisted, flood, series
from blendserve.testing.live import serve_engine
from prometheus_client import REGISTRY
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.parser import text_string_to_metric_families

pytestmark = pytest.mark.slow

#: Requests of the flood.
FLOOD = 2000
#: Every pool label the flood may make: a model no one configured, one answer format,
#: and the budgets of 1 to 16 rounded up to a power of two.
FLOOD_POOLS = {f"other/exact/b{2**k}" for k in range(5)}
#: Series of one pool label: 3 gauges, a counter (2) and a histogram of 10 buckets (14).
SERIES_PER_POOL = 19


def _pools(text: str) -> set[str]:
    return {
        sample.labels["pool"]
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if "pool" in sample.labels
    }


def _flood_and_scrape(n: int) -> tuple[Counter[int], str, str]:
    """The statuses of ``n`` requests, and ``/metrics`` before and after them."""
    with serve_engine(Unlisted(FLOOD_RECORDS), allow_model_aliases=True) as live:
        before = httpx.get(f"{live.url}/metrics", timeout=60).text
        statuses = asyncio.run(flood(live.url, n))
        after = httpx.get(f"{live.url}/metrics", timeout=60).text
    return statuses, before, after


def test_a_flood_of_model_names_and_budgets_leaves_metrics_bounded() -> None:
    statuses, before, after = _flood_and_scrape(FLOOD)
    assert statuses == {200: FLOOD}
    assert FLOOD_MARK not in after
    new_pools = _pools(after) - _pools(before)
    assert new_pools <= FLOOD_POOLS, new_pools
    # Its pools' series, its route's and /metrics' (19 each), and a few unlabelled ones'
    # first values: 10,000 pool labels' series without the bound (190k, 112 MB).
    added = len(series(after)) - len(series(before))
    assert added <= SERIES_PER_POOL * (len(FLOOD_POOLS) + 2) + 20, added
    assert len(after.encode()) < 1_000_000


def test_paths_no_route_has_share_one_endpoint_label() -> None:
    with serve_engine(Unlisted(FLOOD_RECORDS)) as live:
        for i in range(50):
            httpx.get(f"{live.url}/{FLOOD_MARK}/{i}", timeout=10)
            httpx.post(f"{live.url}/v1/{FLOOD_MARK}-{i}", json={}, timeout=10)
        text = httpx.get(f"{live.url}/metrics", timeout=10).text
    assert FLOOD_MARK not in text
    counts = {
        sample.labels["status"]: sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == "blendserve_http_requests_total"
        and sample.labels["endpoint"] == "unmatched"
    }
    assert counts["404"] >= 100


class _Stalled:
    """A collector whose first collect waits until the test lets it go (a slow render)."""

    def __init__(self) -> None:
        self.collecting = threading.Event()
        self.release = threading.Event()
        self.released = False
        self._done = False

    def describe(self) -> list[GaugeMetricFamily]:
        """No names: registering it collects nothing."""
        return []

    def collect(self) -> Iterable[GaugeMetricFamily]:
        """Waits (the first time) until released, then yields one gauge."""
        if not self._done:
            self._done = True
            self.collecting.set()
            self.released = self.release.wait(30)
        yield GaugeMetricFamily("blendserve_test_stalled", "A render the test held.", value=1)


@contextmanager
def _stalled() -> Iterator[_Stalled]:
    """A stalled collector in the process's registry while the block runs."""
    collector = _Stalled()
    REGISTRY.register(collector)
    try:
        yield collector
    finally:
        collector.release.set()
        REGISTRY.unregister(collector)


def test_health_answers_while_a_scrape_renders() -> None:
    scraped: list[httpx.Response] = []
    with _stalled() as collector, serve_engine(Unlisted(FLOOD_RECORDS)) as live:
        scrape = threading.Thread(
            target=lambda: scraped.append(httpx.get(f"{live.url}/metrics", timeout=60))
        )
        scrape.start()
        try:
            assert collector.collecting.wait(30)
            # The render waits for this answer: a render on the event loop would hold it.
            health = httpx.get(f"{live.url}/health", timeout=20)
            assert health.status_code == 200
            assert not collector.released
        finally:
            collector.release.set()
            scrape.join(60)
    assert collector.released
    assert [r.status_code for r in scraped] == [200]
    assert "blendserve_test_stalled 1.0" in scraped[0].text
