"""Trace rules through the service: the ``traces`` field, ``stops`` in answers, the metric,
and what each client's traffic taught kept across its requests."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from blendserve.service import Settings, create_app
from fastapi.testclient import TestClient

DATA = Path(__file__).parents[2] / "fixtures" / "replay_small.jsonl"
SETTINGS = Settings(
    engine="replay", data=str(DATA), default_concurrency=4, client_header="X-Client"
)
RULE = "weighted:measure=length"


def _solve(client: TestClient, who: str, **body: Any) -> dict[str, Any]:
    response = client.post(
        "/solve",
        json={
            "questions": [
                {"id": "q-easy", "prompt": "What is 6 times 7?"},
                {"id": "q-split", "prompt": "Which is it?"},
            ],
            "budget_per_question": 20,
            **body,
        },
        headers={"X-Client": who},
    )
    assert response.status_code == 200, response.text
    result: dict[str, Any] = response.json()
    return result


def test_solve_takes_traces_and_says_why_each_sample_stopped() -> None:
    with TestClient(create_app(SETTINGS)) as client:
        result = _solve(client, "alice", traces=RULE)
        for answer in result["answers"]:
            assert set(answer["stops"]) == {
                "finished",
                "settled",
                "low_confidence",
                "first_m",
                "budget",
            }
            assert answer["stops"]["finished"] == answer["samples"]
            assert answer["cut_tokens"] == 0
        assert sum(a["samples"] for a in result["answers"]) == result["budget"]["spent"]
        metrics = client.get("/metrics").text
        assert 'blendserve_samples_stopped_total{reason="finished"}' in metrics
        assert "blendserve_cut_tokens_total" in metrics


def test_a_bad_rule_is_refused_with_its_reason() -> None:
    with TestClient(create_app(SETTINGS)) as client:
        response = client.post(
            "/solve",
            json={"questions": [{"prompt": "x"}], "budget": 2, "traces": "weighted:keep=2"},
        )
        assert response.status_code == 422
        assert "keep" in response.text
        response = client.post(
            "/v1/completions",
            json={"model": "m", "prompt": "x", "blendserve": {"traces": "vote"}},
        )
        assert response.status_code == 422 and "traces" in response.text


def test_v1_takes_traces_and_reports_stops() -> None:
    with TestClient(create_app(SETTINGS)) as client:
        response = client.post(
            "/v1/completions",
            json={
                "prompt": "What is 6 times 7?",
                "blendserve": {"traces": RULE, "budget_per_question": 4},
            },
        )
        assert response.status_code == 200, response.text
        (vote,) = response.json()["blendserve"]
        assert vote["stops"]["finished"] == vote["samples"] and vote["cut_tokens"] == 0


def test_learning_persists_across_a_clients_requests_and_not_across_clients() -> None:
    app = create_app(SETTINGS)
    with TestClient(app) as client:
        learners = app.state.service.job_maker.learners
        _solve(client, "alice", traces=RULE)
        (alice,) = [learners.get(*key) for key in learners]
        first = alice.rank("length", 0.0)
        _solve(client, "alice", traces=RULE)
        assert len(learners) == 1  # the same client's second request: the same learner
        # Taught by both requests together, it has now tested and ranks what it saw.
        assert first == 0.5 and alice.rank("length", 0.0) == 1.0
        _solve(client, "bob", traces=RULE)
        assert len(learners) == 2
        bob = learners.get(*list(learners)[-1])
        assert bob is not alice and bob.rank("length", 0.0) == 0.5


def test_the_default_rule_counts_whole_votes_and_learns_nothing() -> None:
    app = create_app(SETTINGS)
    with TestClient(app) as client:
        result = _solve(client, "alice")
        assert all(isinstance(v, int) for a in result["answers"] for v in a["votes"].values())
        assert len(app.state.service.job_maker.learners) == 0
