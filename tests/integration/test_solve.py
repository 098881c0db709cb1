"""``POST /solve`` end to end: a real uvicorn server on loopback over the replay engine."""

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from blendserve.engines.replay import LatencyModel, ReplayEngine
from blendserve.testing.live import LiveServer, serve_engine
from blendserve_client import Answer, APIError, AsyncClient, Client, Progress, SolveResult

RECORDS = [
    {"id": "easy", "answers": ["42"] * 9 + ["41"]},
    {"id": "split", "answers": ["7"] * 6 + ["8"] * 4},
    {"id": "sure", "answers": ["3"] * 10},
    {"id": "0", "answers": ["1"]},
]
QUESTIONS = [{"id": r["id"], "prompt": f"question {r['id']}"} for r in RECORDS[:3]]


@pytest.fixture
def engine() -> ReplayEngine:
    return ReplayEngine(RECORDS, seed=5)


def _stalled() -> ReplayEngine:
    return ReplayEngine(RECORDS, latency=LatencyModel(fixed=60))


@pytest.fixture
def server(engine: ReplayEngine) -> Iterator[LiveServer]:
    with serve_engine(engine) as live:
        yield live


def _solve(url: str, **body: Any) -> httpx.Response:
    payload = {"questions": QUESTIONS, "answer": {"kind": "number"}, **body}
    return httpx.post(f"{url}/solve", json=payload, timeout=30)


def test_json_answers_and_budget_accounting(server: LiveServer, engine: ReplayEngine) -> None:
    response = _solve(server.url, budget=45, policy="blend")
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["status"] == "completed"
    assert [a["id"] for a in body["answers"]] == ["easy", "split", "sure"]
    assert body["budget"] == {"total": 45, "spent": 45, "unspent": 0}
    assert body["usage"]["samples"] == 45 == engine.stats.samples
    assert sum(a["samples"] for a in body["answers"]) == 45
    sure = body["answers"][2]
    assert sure["answer"] == "3" and sure["votes"] == {"3": sure["samples"]}
    assert sure["completion"].endswith("the answer is 3.")
    assert 0 < sure["confidence"]["asc"] < 0.01 and sure["confidence"]["share"] == 1.0
    assert body["answers"][0]["answer"] == "42"


def test_budget_per_question_and_early_settling(server: LiveServer) -> None:
    body = _solve(server.url, budget_per_question=50, settle_delta=0.05).json()
    assert body["budget"]["total"] == 150
    sure = body["answers"][2]
    assert sure["settled_early"] and sure["samples"] < 20


def test_a_budget_is_a_ceiling_for_trivial_questions() -> None:
    records = [{"id": str(i), "answers": [str(i * 7)]} for i in range(3)]
    questions = [{"id": r["id"], "prompt": f"question {r['id']}"} for r in records]
    engine = ReplayEngine(records, seed=1)
    with serve_engine(engine) as live:
        body = _solve(live.url, questions=questions, budget=200).json()
        with Client(live.url) as client:  # the client leaves the policy to the service
            result = client.solve(questions, budget=200, answer="number")
    # Each question stops at nine votes, give or take one a sample in flight brought.
    assert 27 <= result.budget.spent <= 30
    assert result.budget.unspent == 200 - result.budget.spent
    assert [a["answer"] for a in body["answers"]] == ["0", "7", "14"]
    # Nine unanimous votes bring ASC's P[p1 < p2] to 1e-3: each question stops there
    # (give or take one sample that was in flight when it did).
    samples = [a["samples"] for a in body["answers"]]
    assert all(9 <= n <= 10 for n in samples)
    assert all(a["settled_early"] for a in body["answers"])
    spent = sum(samples)
    assert body["budget"] == {"total": 200, "spent": spent, "unspent": 200 - spent}
    assert engine.stats.samples == spent + result.budget.spent


def test_a_question_whose_samples_keep_being_cut_stops_and_says_why() -> None:
    # Every recorded completion of "cut" runs past max_tokens (finish reason length);
    # the server's concurrency (4) caps a wave, so it stops within 4 samples.
    cut_record = {"id": "cut", "prompt": "question cut", "answers": [None] * 10}
    engine = ReplayEngine([RECORDS[2], cut_record], seed=5)
    questions = [QUESTIONS[2], {"id": "cut", "prompt": "question cut"}]
    with serve_engine(engine) as live:
        budgeted = _solve(live.url, questions=questions, budget=100, settle_delta=0.05)
        targeted = _solve(live.url, questions=questions, confidence=0.99)
        chat = {
            "model": "replay",
            "messages": [{"role": "user", "content": "question cut"}],
            "blendserve": {"answer": "number", "budget_per_question": 8},
        }
        reply = httpx.post(f"{live.url}/v1/chat/completions", json=chat, timeout=30)
    for response in (budgeted, targeted):
        assert response.status_code == 200, response.text
        body = response.json()
        sure, cut = body["answers"]
        assert cut["stopped"] == "truncated" and cut["answer"] is None
        assert 3 <= cut["samples"] <= 4 and not cut["settled_early"] and not cut["partial"]
        assert sure["stopped"] is None and sure["answer"] == "3" and sure["settled_early"]
        assert body["budget"]["spent"] == sure["samples"] + cut["samples"]
        assert body["budget"]["unspent"] > 0
    assert reply.status_code == 200, reply.text
    (choice,) = reply.json()["choices"]
    vote = reply.json()["blendserve"]
    assert choice["finish_reason"] == "length" and vote["answer"] is None
    assert vote["stopped"] == "truncated" and 3 <= vote["samples"] <= 4


def _sse(url: str, **body: Any) -> list[tuple[str, dict[str, Any]]]:
    events = []
    payload = {"questions": QUESTIONS, "answer": {"kind": "number"}, "stream": True, **body}
    with httpx.stream("POST", f"{url}/solve", json=payload, timeout=30) as response:
        assert response.headers["content-type"].startswith("text/event-stream")
        name = ""
        for line in response.iter_lines():
            if line.startswith("event:"):
                name = line[6:].strip()
            elif line.startswith("data:"):
                events.append((name, json.loads(line[5:])))
    return events


def test_stream_sends_each_answer_once_then_done() -> None:
    with serve_engine(ReplayEngine(RECORDS, latency=LatencyModel(fixed=0.005))) as server:
        events = _sse(server.url, budget=300, settle_delta=0.05)
    names = [name for name, _ in events]
    assert names[-1] == "done" and names.count("done") == 1
    answers = [data for name, data in events if name == "answer"]
    assert sorted(a["id"] for a in answers) == ["easy", "split", "sure"]
    # A settled question is streamed at once, while the contested one goes on
    # (counted in samples: progress events come on a timer, so they prove nothing here).
    assert answers[0]["settled_early"] and answers[-1]["id"] == "split"
    assert answers[0]["samples"] < answers[-1]["samples"]
    assert "progress" in names
    done = events[-1][1]
    assert done["budget"]["spent"] == sum(a["samples"] for a in answers)
    assert done["budget"]["unspent"] == 300 - done["budget"]["spent"]


def test_ndjson_on_accept_header(server: LiveServer) -> None:
    payload = {"questions": QUESTIONS, "budget": 12}
    headers = {"Accept": "application/x-ndjson"}
    response = httpx.post(f"{server.url}/solve", json=payload, headers=headers, timeout=30)
    lines = [json.loads(line) for line in response.text.splitlines()]
    assert lines[-1]["event"] == "done"
    assert sum(line["event"] == "answer" for line in lines) == 3


@pytest.mark.parametrize(
    "body,param",
    [
        ({"budget": 2}, None),
        ({}, None),
        ({"budget": 10, "budget_per_question": 3}, None),
        ({"budget": 10, "policy": "oracle"}, "policy"),
        ({"budget": 10, "policy": "blend:cap=x"}, "policy"),
        ({"budget": 10, "policy": "hedge:rank=ppr"}, "policy"),
        ({"budget": 10, "policy": "asc:rank=value"}, "policy"),
        ({"budget": 10, "answer": {"kind": "regex"}}, "answer"),
        ({"budget": 10, "sampling": {"temperature": -1}}, "sampling.temperature"),
        ({"budget": 10, "questions": [{"prompt": "a", "messages": []}]}, "questions.0.messages"),
        ({"budget": 10, "questions": []}, "questions"),
        ({"budget": 10, "max_rounds": 65}, "max_rounds"),
        ({"budget": 10, "max_rounds": -1}, "max_rounds"),
    ],
)
def test_bad_requests_are_422_with_the_field(
    server: LiveServer, body: dict[str, Any], param: str | None
) -> None:
    response = _solve(server.url, **body)
    assert response.status_code == 422
    error = response.json()["error"]
    assert error["message"]
    if param is not None:
        assert error["param"].startswith(param)


@pytest.mark.parametrize("policy", ["hedge:rank=asc", "hedge:rank=value"])
def test_the_default_policy_ranks_either_way(server: LiveServer, policy: str) -> None:
    response = _solve(server.url, budget=30, policy=policy)
    assert response.status_code == 200, response.text
    body = response.json()
    assert len(body["answers"]) == len(QUESTIONS)
    assert body["budget"]["spent"] == sum(a["samples"] for a in body["answers"]) <= 30


def test_on_an_engine_with_room_a_job_sends_at_most_max_rounds_waves_a_question() -> None:
    requests = {}
    for rounds in (2, 0):
        engine = ReplayEngine(RECORDS, seed=5, latency=LatencyModel(max_concurrent_sequences=512))
        with serve_engine(engine, default_concurrency=None) as live:  # no bound on waves
            response = _solve(live.url, budget=45, max_rounds=rounds)
        assert response.status_code == 200, response.text
        body = response.json()
        assert body["usage"]["samples"] == body["budget"]["spent"] == engine.stats.samples
        requests[rounds] = engine.stats.requests
    assert requests[2] <= 2 * len(QUESTIONS) < requests[0]


# --- a quality target instead of a budget ----------------------------------------------


def test_confidence_stops_each_question_at_the_target_or_its_cap(
    server: LiveServer, engine: ReplayEngine
) -> None:
    # Without a bound on waves (max_rounds 0), a question ends at the target or its cap only.
    response = _solve(server.url, confidence=0.99, max_samples_per_question=40, max_rounds=0)
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["status"] == "completed"
    answers = {a["id"]: a for a in body["answers"]}
    assert [a["index"] for a in body["answers"]] == [0, 1, 2]
    # Unanimous votes: ASC's P[p1 < p2] = 2^-(n + 1), at most 0.01 from 6 samples on.
    sure = answers["sure"]
    assert sure["answer"] == "3" and sure["samples"] == 6 and sure["settled_early"]
    for a in body["answers"]:
        assert a["settled_early"] == (a["confidence"]["asc"] <= 0.01), a
        assert a["settled_early"] or a["samples"] == 40
        assert not a["partial"]
    spent = sum(a["samples"] for a in body["answers"])
    # The budget is the cap times the questions; unspent is what the target saved.
    assert body["budget"] == {"total": 120, "spent": spent, "unspent": 120 - spent}
    assert body["usage"]["samples"] == spent == engine.stats.samples


def test_confidence_streams_each_answer_as_it_settles() -> None:
    with serve_engine(ReplayEngine(RECORDS, seed=5, latency=LatencyModel(fixed=0.05))) as live:
        events = _sse(live.url, confidence=0.99, max_samples_per_question=200, concurrency=64)
        headers = {"Accept": "application/x-ndjson"}
        payload = {"questions": QUESTIONS, "answer": {"kind": "number"}, "confidence": 0.9}
        ndjson = httpx.post(f"{live.url}/solve", json=payload, headers=headers, timeout=30)
    names = [name for name, _ in events]
    assert names == ["answer"] * 3 + ["done"]
    answers = [data for name, data in events if name == "answer"]
    # The unanimous question takes one wave; the 60/40 split needs more, so it comes last.
    assert answers[0]["id"] in ("sure", "easy") and answers[-1]["id"] == "split"
    assert answers[-1]["samples"] > answers[0]["samples"]
    done = events[-1][1]
    assert done["status"] == "completed" and done["budget"]["total"] == 600
    assert done["budget"]["spent"] == sum(a["samples"] for a in answers)
    lines = [json.loads(line) for line in ndjson.text.splitlines()]
    assert [line["event"] for line in lines] == ["answer"] * 3 + ["done"]


@pytest.mark.parametrize(
    "body,param",
    [
        ({"confidence": 0.9, "budget": 30}, "budget"),
        ({"confidence": 0.9, "budget_per_question": 8}, "budget_per_question"),
        ({"confidence": 0.9, "policy": "blend"}, "policy"),
        ({"confidence": 0.9, "settle_delta": 0.1}, "settle_delta"),
        ({"confidence": 0.9, "in_flight_per_question": 1}, "in_flight_per_question"),
        ({"confidence": 0.5}, "confidence"),
        ({"confidence": 1}, "confidence"),
        ({"budget": 30, "max_samples_per_question": 8}, "max_samples_per_question"),
        ({"confidence": 0.9, "max_samples_per_question": 0}, "max_samples_per_question"),
    ],
)
def test_confidence_refuses_budget_fields_with_the_param(
    server: LiveServer, body: dict[str, Any], param: str
) -> None:
    response = _solve(server.url, **body)
    assert response.status_code == 422, response.text
    error = response.json()["error"]
    assert error["param"] == param and error["type"] == "invalid_request_error"


def test_confidence_over_the_job_limit_names_the_cap() -> None:
    with serve_engine(ReplayEngine(RECORDS), max_budget_per_job=100) as live:
        response = _solve(live.url, confidence=0.9)  # 3 questions x 64 samples
        assert response.status_code == 422
        assert response.json()["error"]["param"] == "max_samples_per_question"
        assert _solve(live.url, confidence=0.9, max_samples_per_question=30).status_code == 200


def test_clients_take_a_confidence(server: LiveServer) -> None:
    import asyncio

    with Client(server.url) as client:
        result = client.solve(QUESTIONS, confidence=0.95, answer="number")
        assert result.status == "completed" and result.by_id()["sure"].samples == 4
        assert result.budget.total == 64 * 3
        with pytest.raises(APIError) as info:
            client.solve(QUESTIONS, confidence=0.95, policy="asc")
        assert info.value.status_code == 422 and info.value.param == "policy"

    async def streamed() -> list[Any]:
        async with AsyncClient(server.url) as client:
            stream = client.stream(QUESTIONS, confidence=0.95, max_samples_per_question=8)
            return [e async for e in stream]

    events = asyncio.run(asyncio.wait_for(streamed(), 30))
    assert sum(isinstance(e, Answer) for e in events) == 3
    assert isinstance(events[-1], SolveResult) and events[-1].budget.total == 24


def test_health_and_models(server: LiveServer) -> None:
    health = httpx.get(f"{server.url}/health").json()
    assert health == {
        "status": "ok",
        "engine": "replay",
        "upstreams": {"replay": True},
        "capacity": None,
        "cost": None,
        "detail": None,
    }
    models = httpx.get(f"{server.url}/v1/models").json()
    assert models["object"] == "list" and models["data"][0]["id"] == "replay"


def test_client_disconnect_cancels_upstream_work() -> None:
    engine = _stalled()
    with serve_engine(engine) as live:
        payload = {"questions": QUESTIONS, "budget": 30, "stream": True}
        with httpx.stream("POST", f"{live.url}/solve", json=payload, timeout=30):
            deadline = time.monotonic() + 10
            while not engine.stats.in_flight and time.monotonic() < deadline:
                time.sleep(0.01)
            assert engine.stats.in_flight > 0
        deadline = time.monotonic() + 5
        while engine.stats.in_flight and time.monotonic() < deadline:
            time.sleep(0.01)
        assert engine.stats.in_flight == 0 and engine.stats.samples == 0


def test_a_gone_client_cancels_a_non_streamed_job_within_a_second() -> None:
    engine = _stalled()
    with serve_engine(engine) as live:
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(f"{live.url}/solve", json={"questions": QUESTIONS, "budget": 30}, timeout=1)
        assert engine.stats.requests > 0
        left = time.monotonic()
        while engine.stats.in_flight and time.monotonic() < left + 5:
            time.sleep(0.01)
        assert engine.stats.in_flight == 0 and engine.stats.samples == 0
        assert time.monotonic() - left < 1


def test_sync_client_solve_and_stream(server: LiveServer) -> None:
    with Client(server.url) as client:
        result = client.solve(QUESTIONS, budget=30, answer="number")
        assert result.status == "completed" and result.by_id()["sure"].answer == "3"
        events = list(client.stream(QUESTIONS, budget=30, answer="number"))
    assert isinstance(events[-1], SolveResult)
    assert sum(isinstance(e, Answer) for e in events) == 3
    # The stream ends with the whole result, its answers in question order.
    assert [a.id for a in events[-1].answers] == ["easy", "split", "sure"]
    assert all(isinstance(e, (Answer, Progress)) for e in events[:-1])
    with Client(server.url) as client, pytest.raises(APIError) as info:
        client.solve(QUESTIONS, budget=1)
    assert info.value.status_code == 422


def test_async_client(server: LiveServer) -> None:
    import asyncio

    async def scenario() -> tuple[SolveResult, list[Any]]:
        async with AsyncClient(server.url) as client:
            result = await client.solve(["plain prompt"], budget=3)
            events = [e async for e in client.stream(QUESTIONS, budget=9)]
            return result, events

    result, events = asyncio.run(asyncio.wait_for(scenario(), 30))
    assert result.answers[0].id == "0"
    assert isinstance(events[-1], SolveResult) and events[-1].budget.spent == 9
    assert [a.id for a in events[-1].answers] == ["easy", "split", "sure"]


def test_cli_prints_answers_as_jsonl(server: LiveServer, tmp_path: Path) -> None:
    questions = tmp_path / "q.jsonl"
    questions.write_text("\n".join(json.dumps(q) for q in QUESTIONS) + "\n")
    done = subprocess.run(
        [sys.executable, "-m", "blendserve.cli", "solve", str(questions), "--budget", "30",
         "--url", server.url, "--answer", "number", "--no-progress"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    lines = [json.loads(line) for line in done.stdout.splitlines()]
    assert sorted(line["id"] for line in lines) == ["easy", "split", "sure"]
    assert "completed: 30/30 samples" in done.stderr
