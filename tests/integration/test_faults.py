"""Upstream faults end to end: blendserve on uvicorn, the OpenAI engine, fake upstreams.

The fake upstreams (``blendserve.testing.fake_openai``, not models) inject seeded
faults: 5xx answers, requests that hang until the caller leaves, dropped
connections and slow answers. They count every sample they serve, so the
tests can check that a job counts each served sample exactly once.
"""

import json
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import openai
import pytest
from blendserve.engines.config import Health, RetryPolicy
from blendserve.engines.openai import OpenAIEngine
from blendserve.service import metrics
from blendserve.testing.accounting import assert_accounting
from blendserve.testing.fake_openai import FakeServer, FakeState
from blendserve.testing.live import serve_engine
from blendserve.testing.waiting import wait_until

pytestmark = pytest.mark.slow

QUESTIONS = [
    {"id": f"q{i}", "messages": [{"role": "user", "content": f"question {i}?"}]} for i in range(4)
]
ANSWERS = ("7", "7", "7", "8", "9")
# The job default: how long transient failures may last before a job gives up.
FAILURE_TIMEOUT_S = 5.0
# Samples a job keeps in flight in the test of upstreams killed mid-job.
CONCURRENCY = 4


@pytest.fixture
def faulty() -> Iterator[list[FakeServer]]:
    """Two replicas: 30% 5xx, 5% hangs, 5% dropped connections, 10% slow answers."""
    servers = [
        FakeServer(
            FakeState(
                name=f"up{i}",
                answers=ANSWERS,
                latency=0.005,
                error_rate=0.3,
                timeout_rate=0.05,
                drop_rate=0.05,
                slow_rate=0.1,
                slow_latency=0.15,
                fault_seed=i,
                record=False,
            )
        ).start()
        for i in range(2)
    ]
    yield servers
    for server in servers:
        server.stop()


def test_every_job_completes_and_counts_each_served_sample_once(
    faulty: list[FakeServer],
) -> None:
    # A short probe interval: with 30% errors a replica's breaker opens often,
    # and the job rides each open spell out (it is far below FAILURE_TIMEOUT_S).
    engine = OpenAIEngine(
        [s.url for s in faulty],
        retry=RetryPolicy(backoff_base=0.02),
        health=Health(probe_interval=0.1, failure_threshold=3),
    )
    # Hangs end at the 3 s request deadline, well after any answered attempt
    # (4 attempts of <= 0.2 s plus backoffs), so no served answer is ever cut off.
    with serve_engine(engine, default_concurrency=6, upstream_timeout=3.0) as live:

        def solve(budget: int) -> dict[str, Any]:
            payload = {"questions": QUESTIONS, "budget": budget, "answer": {"kind": "number"}}
            response = httpx.post(f"{live.url}/solve", json=payload, timeout=60)
            assert response.status_code == 200, response.text
            return dict(response.json())

        budgets = [40, 60, 80, 100]
        with ThreadPoolExecutor(len(budgets)) as pool:
            results = list(pool.map(solve, budgets))
        health = httpx.get(f"{live.url}/health").json()
        accounting = assert_accounting(live.url, engine.urls)

    for result, budget in zip(results, budgets, strict=True):
        assert result["status"] == "completed", result["error"]
        assert result["budget"] == {"total": budget, "spent": budget, "unspent": 0}
        counted = sum(a["samples"] for a in result["answers"])
        assert counted == result["usage"]["samples"] == budget
        assert all(not a["partial"] and a["answer"] in ANSWERS for a in result["answers"])
        # Every sample either voted or abstained; none has an answer that is lost.
        assert all(sum(a["votes"].values()) == a["samples"] for a in result["answers"])
    served = sum(s.state.samples_served for s in faulty)
    requests = sum(s.state.requests for s in faulty)
    faults = [s.state.faults for s in faulty]
    print(f"\n{served} samples served over {requests} requests, faults {faults}")
    assert served == sum(budgets)  # none lost, none counted twice
    assert accounting.total("completed") == served
    for kind in ("error", "timeout", "drop", "slow"):
        assert sum(s.state.faults.get(kind, 0) for s in faulty) > 0, kind
    # Hung requests were given up (the upstream notices a moment later).
    wait_until(
        lambda: sum(s.state.disconnects for s in faulty) > 0, 5, "a hung request to be dropped"
    )
    assert set(health["upstreams"]) == {s.url for s in faulty}


def _slow_upstreams() -> list[FakeServer]:
    return [
        FakeServer(FakeState(name=f"up{i}", answers=ANSWERS, latency=0.05, record=False)).start()
        for i in range(2)
    ]


def _kill_when_serving(upstreams: list[FakeServer], samples: int) -> float:
    """Kills every upstream once they served ``samples``; returns when they were gone."""
    wait_until(
        lambda: sum(u.state.samples_served for u in upstreams) >= samples, 30, f"{samples} samples"
    )
    for upstream in upstreams:
        upstream.signal_stop(kill=True)
    for upstream in upstreams:
        upstream.join()
    return time.monotonic()


def _in_background(call: Callable[[], Any]) -> tuple[threading.Thread, list[Any]]:
    box: list[Any] = []
    thread = threading.Thread(target=lambda: box.append(call()))
    thread.start()
    return thread, box


@pytest.mark.parametrize("stream", [False, True])
def test_every_upstream_killed_mid_job_ends_it_failed_with_partial_answers(stream: bool) -> None:
    upstreams = _slow_upstreams()
    engine = OpenAIEngine([u.url for u in upstreams], retry=RetryPolicy(backoff_base=0.02))
    payload = {
        "questions": QUESTIONS,
        "budget": 4000,
        "answer": {"kind": "number"},
        "stream": stream,
    }
    with serve_engine(engine, default_concurrency=CONCURRENCY) as live:

        def solve() -> tuple[float, dict[str, Any]]:
            if not stream:
                response = httpx.post(f"{live.url}/solve", json=payload, timeout=60)
                assert response.status_code == 200, response.text
                return time.monotonic(), dict(response.json())
            answers: list[dict[str, Any]] = []
            with httpx.stream("POST", f"{live.url}/solve", json=payload, timeout=60) as response:
                name = ""
                for line in response.iter_lines():
                    if line.startswith("event: "):
                        name = line[7:]
                    elif line.startswith("data: ") and name == "answer":
                        answers.append(json.loads(line[6:]))
                    elif line.startswith("data: ") and name == "done":
                        return time.monotonic(), {**json.loads(line[6:]), "answers": answers}
            raise AssertionError("the stream ended without a done event")

        thread, box = _in_background(solve)
        gone = _kill_when_serving(upstreams, 40)
        thread.join(30)
        assert not thread.is_alive()
        health = httpx.get(f"{live.url}/health").json()
        accounting = assert_accounting(live.url, engine.urls)
    ended, result = box[0]
    took = ended - gone
    print(f"\nall upstreams down -> job ended in {took:.2f} s (stream={stream})")
    assert took < FAILURE_TIMEOUT_S + 3
    assert result["status"] == "failed" and "in a row" in result["error"]
    answers = result["answers"]
    assert sorted(a["id"] for a in answers) == [q["id"] for q in QUESTIONS]
    # A question may settle (the default's ceiling) before the upstreams went down.
    assert all(a["partial"] != a["settled_early"] for a in answers)
    assert all(a["answer"] in ANSWERS and a["samples"] > 0 for a in answers)
    counted = sum(a["samples"] for a in answers)
    assert counted == result["usage"]["samples"] == result["budget"]["spent"]
    served = sum(u.state.samples_served for u in upstreams)
    assert accounting.total("completed") == served
    # A sample that comes back in the moment its request is cut (its question settled,
    # or the job gave up) is refunded, not counted: at most the job's samples in flight.
    assert counted <= served <= counted + CONCURRENCY
    assert health["upstreams"] == {u.url: False for u in upstreams}
    for upstream in upstreams:
        gauge = metrics.UPSTREAM_HEALTHY.labels(engine.urls[upstreams.index(upstream)])
        assert gauge._value.get() == 0  # breaker open


@pytest.mark.parametrize("stream", [False, True])
def test_v1_question_without_any_answer_is_an_openai_503(stream: bool) -> None:
    upstream = FakeServer(FakeState(name="gone")).start()
    url = upstream.url
    upstream.kill()  # down before the first request: no question gets a sample
    engine = OpenAIEngine([url], retry=RetryPolicy(backoff_base=0.02))
    with serve_engine(engine, default_concurrency=6) as live:
        client = openai.OpenAI(base_url=f"{live.url}/v1", api_key="x", max_retries=0)
        started = time.monotonic()
        with pytest.raises(openai.APIError) as caught:
            messages: Any = [{"role": "user", "content": "Three?"}]
            reply = client.chat.completions.create(model="m", messages=messages, stream=stream)
            if stream:
                for _ in reply:  # type: ignore[union-attr]
                    pass
        took = time.monotonic() - started
        client.close()
        accounting = assert_accounting(live.url, engine.urls)
    print(f"\n/v1 with every upstream down answered in {took:.2f} s (stream={stream})")
    assert took < FAILURE_TIMEOUT_S + 3
    error = caught.value.body
    assert isinstance(error, dict)
    if not stream:
        assert isinstance(caught.value, openai.APIStatusError)
        assert caught.value.status_code == 503
    assert error["code"] == 503 and error["type"] == "server_error"
    assert "in a row" in error["message"]
    assert accounting.total("failed") > 0 and accounting.total("completed") == 0
