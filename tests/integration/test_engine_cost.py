"""The service's cost model on a real server: a profile, vLLM's series learnt, both shown."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.support.command import serve_command
from tests.support.fake_openai import FakeServer, FakeState
from tests.support.waiting import wait_until

SOLVE = {"questions": [{"id": "q", "prompt": "2+2?"}], "budget": 2}


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


def _series(steps: float, tokens: float, seconds: float) -> str:
    """vLLM's step-cost series after ``steps`` steps that made ``tokens`` tokens."""
    labels = '{engine="0",model_name="fake-model"}'
    return "\n".join(
        [
            f"vllm:iteration_tokens_total_count{labels} {steps}",
            f"vllm:inter_token_latency_seconds_count{labels} {tokens}",
            f"vllm:inter_token_latency_seconds_sum{labels} {seconds}",
            f"vllm:request_prompt_tokens_count{labels} {tokens / 100}",
            f"vllm:request_prompt_tokens_sum{labels} {tokens * 3}",
            f"vllm:request_generation_tokens_count{labels} {tokens / 100}",
            f"vllm:request_generation_tokens_sum{labels} {tokens}",
        ]
    )


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
    state = FakeState()
    with FakeServer(state) as upstream, serve_command("--upstream", upstream.url) as (url, _):
        assert _health(url)["cost"] is None and _step_gauges(url) == {}
        # A step of B sequences takes 50 + 5 B ms: readings at B = 1, then 16.
        state.extra_metrics = _series(0, 0, 0.0)
        assert httpx.post(f"{url}/solve", json=SOLVE, timeout=30).status_code == 200
        seen = state.metrics_requests
        wait_until(lambda: state.metrics_requests > seen, 10, "a reading of the baseline")
        state.extra_metrics = _series(100, 100, 100 * 0.055)
        wait_until(lambda: _health(url)["cost"] is not None, 10, "a first observation")
        cost = _health(url)["cost"]
        assert cost["live_observations"] == 1 and cost["fit"] is None  # one width: no line
        state.extra_metrics = _series(200, 100 + 1600, 100 * 0.055 + 1600 * 0.130)
        wait_until(lambda: _health(url)["cost"]["fit"] is not None, 10, "a fit")
        cost = _health(url)["cost"]
        gauges = _step_gauges(url)
    assert cost["profile"] is None and cost["live_observations"] == 2
    assert cost["context"] == 350  # prompt 300 + half of generation's 100
    assert cost["step_ms"]["1"] == pytest.approx(55.0, rel=1e-3)
    assert cost["step_ms"]["32"] == pytest.approx(210.0, rel=1e-3)
    assert gauges["128"] == pytest.approx(0.690, rel=1e-3)
