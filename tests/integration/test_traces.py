"""A trace rule through a real server: /solve over uvicorn on a fake engine that cuts."""

from __future__ import annotations

import httpx
from blendserve.testing.live import serve_engine

from tests.unit.scheduler.test_traces import FakeTraceEngine, trained

#: A confident right answer and an unconfident wrong one, as numbers /solve's answers read.
SURE, UNSURE = ("7", 100, 0.9), ("8", 100, 0.1)


def test_solve_cuts_with_the_clients_learned_bar_and_says_so() -> None:
    engine = FakeTraceEngine({"which?": [SURE, UNSURE, UNSURE]})
    with serve_engine(engine, client_header="X-Client") as server:
        maker = server.service.job_maker
        body = {
            "questions": [{"id": "which?", "prompt": "which?"}],
            "budget": 6,
            "traces": "weighted:measure=mean,cut=60",
            "sampling": {"max_tokens": 400},
        }
        with httpx.Client(base_url=server.url, timeout=30) as client:
            # A first request teaches the client's learner nothing it trusts yet: no cut.
            first = client.post("/solve", json=body, headers={"X-Client": "alice"}).json()
            (learned,) = list(maker.learners)
            trained(maker.learners.get(*learned))  # as if alice's earlier traffic had
            second = client.post("/solve", json=body, headers={"X-Client": "alice"}).json()
            metrics = client.get("/metrics").text
    (before,), (after,) = first["answers"], second["answers"]
    assert before["stops"]["low_confidence"] == 0 and before["answer"] == "8"
    assert after["stops"]["low_confidence"] == 4 and after["cut_tokens"] == 200
    assert after["answer"] == "7" and after["votes"] == {"7": 2}
    assert 'blendserve_samples_stopped_total{reason="low_confidence"}' in metrics
