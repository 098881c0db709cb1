"""``/metrics`` after real jobs: a live server over the replay engine."""

import re
from typing import Any

import httpx
import pytest
from blendserve.engines.openai import OpenAIEngine, normalise_base_url
from blendserve.engines.replay import ReplayEngine
from blendserve.service import Settings, create_app
from blendserve.service.metrics import UPSTREAM_OUTCOMES
from blendserve.testing.command import serve_command
from blendserve.testing.fake_openai import FakeServer, FakeState
from blendserve.testing.live import LiveServer, serve_engine
from prometheus_client.parser import text_string_to_metric_families

RECORDS = [
    {"id": "a", "prompt": "A?", "answers": ["1"] * 9 + ["2"]},
    {"id": "b", "prompt": "B?", "answers": ["3"] * 10},
]


def _scrape(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = httpx.get(f"{url}/metrics").text
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def _value(scraped: dict, name: str, **labels: str) -> float:
    return scraped.get((name, tuple(sorted(labels.items()))), 0.0)


def test_jobs_samples_answers_and_requests_are_counted() -> None:
    engine = ReplayEngine(RECORDS, seed=1)

    async def factory() -> ReplayEngine:
        return engine

    with LiveServer(create_app(Settings(), engine_factory=factory)) as live:
        before = _scrape(live.url)
        body = {
            "questions": [{"id": "a", "prompt": "A?"}, {"id": "b", "prompt": "B?"}],
            "budget": 20,
            "answer": {"kind": "number"},
            "settle_delta": 0.1,
        }
        result = httpx.post(f"{live.url}/solve", json=body, timeout=30).json()
        httpx.post(f"{live.url}/solve", json={"questions": []}, timeout=30)
        after = _scrape(live.url)
        names = {name for name, _ in after}

    def delta(name: str, **labels: str) -> float:
        return _value(after, name, **labels) - _value(before, name, **labels)

    spent = result["budget"]["spent"]
    assert delta("blendserve_samples_per_question_count") == 2
    assert delta("blendserve_samples_per_question_sum") == spent
    assert delta("blendserve_budget_granted_samples_total") == 20
    assert delta("blendserve_budget_spent_samples_total") == spent
    assert delta("blendserve_budget_unspent_samples_total") == 20 - spent
    settled = sum(a["settled_early"] for a in result["answers"])
    assert delta("blendserve_answers_total", settled_early="true") == settled
    assert delta("blendserve_answers_total", settled_early="false") == 2 - settled
    assert delta("blendserve_upstream_samples_total", upstream="replay", outcome="completed") == (
        spent
    )
    assert delta("blendserve_completion_tokens_total") == result["usage"]["completion_tokens"]
    assert delta("blendserve_jobs_total", status="completed") == 1
    assert delta("blendserve_http_requests_total", endpoint="/solve", status="200") == 1
    assert delta("blendserve_http_requests_total", endpoint="/solve", status="422") == 1
    for gauge in ("in_flight_samples", "active_jobs", "queued_questions"):
        assert delta(f"blendserve_{gauge}") == 0, gauge
    assert _value(after, "blendserve_upstream_healthy", upstream="replay") == 1
    ours = {n for n in names if n.startswith("blendserve_")}
    assert len(ours) >= 20 and not any("vllm" in n for n in ours)
    assert all(re.fullmatch(r"[a-z_]+", n) for n in ours)


def test_a_fresh_server_exports_each_upstream_series_at_zero() -> None:
    # A new process: no request has touched any labelled series yet.
    with FakeServer() as upstream, serve_command("--upstream", upstream.url) as (url, _):
        scraped = _scrape(url)
    label = normalise_base_url(upstream.url)
    assert scraped.get(("blendserve_upstream_retries_total", (("upstream", label),))) == 0.0
    for outcome in ("dispatched", "completed", "failed", "cancelled"):
        key = ("blendserve_upstream_samples_total", (("outcome", outcome), ("upstream", label)))
        assert scraped.get(key) == 0.0, outcome
    duration = ("blendserve_upstream_request_duration_seconds_count", (("upstream", label),))
    assert scraped.get(duration) == 0.0
    assert scraped.get(("blendserve_upstream_healthy", (("upstream", label),))) == 1.0
    assert upstream.state.requests == 0


def upstream_samples(url: str, upstream: str) -> dict[str, float]:
    """``upstream``'s samples by outcome, as the server at ``url`` exports them now."""
    scraped = _scrape(url)
    name = "blendserve_upstream_samples_total"
    return {o: _value(scraped, name, upstream=upstream, outcome=o) for o in UPSTREAM_OUTCOMES}


def assert_samples_add_up(
    before: dict[str, float], after: dict[str, float], result: dict[str, Any]
) -> None:
    """Each dispatched sample has one outcome, and a /solve result counts those completed."""
    dispatched, completed, failed, cancelled = (after[o] - before[o] for o in UPSTREAM_OUTCOMES)
    assert dispatched == completed + failed + cancelled > 0  # nothing in flight
    answers = result["answers"]
    assert all(a["samples"] == a["usage"]["samples"] for a in answers)
    assert sum(a["samples"] for a in answers) == result["usage"]["samples"]
    assert result["usage"]["samples"] == result["budget"]["spent"] == completed


@pytest.mark.parametrize("stream", [False, True])
def test_samples_add_up_on_an_upstream_that_ignores_n(stream: bool) -> None:
    state = FakeState(honour_n=False, answers=("1", "2", "3"))
    with FakeServer(state) as upstream:
        # n_support="yes": requests of n (not one sample a request), answered short.
        engine = OpenAIEngine([upstream.url], stream=stream, n_support="yes")
        label = normalise_base_url(upstream.url)
        with serve_engine(engine) as live:
            before = upstream_samples(live.url, label)
            body = {
                "questions": [
                    {"id": str(i), "messages": [{"role": "user", "content": f"Q{i}?"}]}
                    for i in range(3)
                ],
                "budget": 24,
                "answer": {"kind": "number"},
                "concurrency": 8,
                "in_flight_per_question": 2,
            }
            result = httpx.post(f"{live.url}/solve", json=body, timeout=30).json()
            after = upstream_samples(live.url, label)
    assert result["status"] == "completed" and result["budget"]["spent"] == 24
    assert max(b.get("n", 1) for b in state.bodies) > 1  # answered short, then topped up
    assert after["cancelled"] > before["cancelled"]
    assert_samples_add_up(before, after, result)


def test_answers_past_their_time_limit_are_counted() -> None:
    slow_text = "the quick brown fox " * 100 + ".x"  # backtracks past the pattern's limit
    engine = ReplayEngine([{"id": "a", "prompt": "A?", "answers": [slow_text]}], seed=1)

    async def factory() -> ReplayEngine:
        return engine

    with LiveServer(create_app(Settings(), engine_factory=factory)) as live:
        before = _scrape(live.url)
        body = {
            "questions": [{"id": "a", "prompt": "A?"}],
            "budget": 3,
            "answer": {"kind": "regex", "pattern": r"(?:[a-z ]|[a-z ][a-z ])+\.$"},
        }
        result = httpx.post(f"{live.url}/solve", json=body, timeout=30).json()
        after = _scrape(live.url)

    (answer,) = result["answers"]
    assert answer["answer"] is None and answer["samples"] == 3
    name = "blendserve_answer_timeouts_total"
    assert _value(after, name, stage="regex") - _value(before, name, stage="regex") == 3
    assert (name, (("stage", "sympy"),)) in after
