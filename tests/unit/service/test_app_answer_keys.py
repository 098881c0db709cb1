"""An app keys its answers with state of its own, started and stopped by its lifespan."""

from pathlib import Path

from blendserve import answers
from blendserve.service import Settings, create_app
from fastapi.testclient import TestClient

DATA = Path(__file__).parents[2] / "fixtures" / "replay_small.jsonl"
SETTINGS = Settings(engine="replay", data=str(DATA), default_concurrency=2)
BODY = {
    "questions": [{"id": "q-easy", "prompt": "What is 6 times 7?"}],
    "budget_per_question": 3,
    "answer": {"kind": "math"},
}


def _solve(client: TestClient) -> str:
    response = client.post("/solve", json=BODY)
    assert response.status_code == 200, response.text
    return str(response.json()["answers"][0]["answer"])


def test_an_app_owns_its_answer_keys_and_stops_their_workers() -> None:
    app = create_app(SETTINGS)
    with TestClient(app) as client:
        keys = app.state.service.job_maker.keys
        assert keys is not answers.default_keys()
        assert _solve(client) == "42" and len(keys.aliases) >= 1  # keyed by the app's own
        assert keys.pool is not None
    assert keys.pool is None and keys.executor is None


def test_keys_given_to_an_app_are_shared_and_left_running() -> None:
    keys = answers.AnswerKeys()
    try:
        first, second = (
            create_app(SETTINGS, answer_keys=keys),
            create_app(SETTINGS, answer_keys=keys),
        )
        cached, hits = [], []
        for app in (first, second):
            with TestClient(app) as client:
                assert app.state.service.job_maker.keys is keys and _solve(client) == "42"
            cached.append(len(keys.aliases))
            hits.append(keys.cache_info().hits)
        assert keys.pool is not None
        assert cached[0] >= 1 and cached[1] == cached[0]  # the second app found the first's keys
        assert hits[1] > hits[0]
    finally:
        keys.shutdown()
