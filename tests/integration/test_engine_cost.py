"""The service's cost model on a real server: a profile, vLLM's series learnt, both shown."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from blendserve.testing.command import serve_command
from blendserve.testing.fake_openai import FakeServer, FakeState
from prometheus_client.parser import text_string_to_metric_families


def _health(url: str) -> dict[str, Any]:
    return httpx.get(f"{url}/health", timeout=10).json()


def _step_gauges(url: str) -> dict[str, float]:
    text = httpx.get(f"{url}/metrics", timeout=10).text
    return {
        s.labels["width"]: s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == "blendserve_engine_step_seconds"
    }


def test_a_profile_is_shown_in_health_and_metrics() -> None:
    with (
        FakeServer() as upstream,
        serve_command("--upstream", upstream.url, "--engine-profile", "qwen2.5-7b-h100") as (
            url,
            _,
        ),
    ):
        cost = _health(url)["cost"]
        gauges = _step_gauges(url)
    assert cost["profile"] == "qwen2.5-7b-h100" and cost["live_observations"] == 0
    assert cost["fit"]["name"] == "qwen2.5-7b-h100"
    assert 6.0 < cost["step_ms"]["1"] < cost["step_ms"]["512"] < 40.0
    assert set(gauges) == {"1", "8", "32", "128", "512"}
    assert gauges["8"] == pytest.approx(cost["step_ms"]["8"] / 1000, rel=1e-3)


def test_without_a_profile_vllms_own_series_teach_the_cost() -> None:
    """A fake vLLM whose step of B sequences takes 20 + 2 B ms, and whose step series say so as
    its time passes: a job at width 1, then one at 16, teach the service that line."""
    state = FakeState(step_cost=(0.020, 0.002), record=False)
    with FakeServer(state) as upstream, serve_command("--upstream", upstream.url) as (url, _):
        assert _health(url)["cost"] is None and _step_gauges(url) == {}
        for n in (1, 16):
            body = {"questions": [{"id": "q", "prompt": "What is 2+2?"}], "budget": n,
                    "policy": "sc", "sampling": {"max_tokens": 150}}  # fmt: skip
            assert httpx.post(f"{url}/solve", json=body, timeout=60).status_code == 200
        cost = _health(url)["cost"]
        gauges = _step_gauges(url)
    assert cost["profile"] is None and cost["live_observations"] >= 2, cost
    assert cost["fit"]["name"] == "live", cost
    assert cost["context"] == 78  # prompt 3 + half of generation's 150
    assert cost["step_ms"]["1"] == pytest.approx(22.0, rel=0.15), cost
    assert cost["step_ms"]["32"] == pytest.approx(84.0, rel=0.15), cost
    assert gauges["128"] == pytest.approx(cost["step_ms"]["128"] / 1000, rel=1e-3)
