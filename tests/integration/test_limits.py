"""Request limits (422 naming the field, 413), admission (429 with ``Retry-After``) and
the graceful shutdown of ``blendserve serve`` on SIGTERM.

A real uvicorn server on loopback over the replay engine; jobs are held open
by a replay latency and the tests poll the service's admission counters.
"""

import asyncio
import json
import signal
import socket
import time
from collections.abc import AsyncIterator, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from blendserve.engines.base import GenerateRequest, Sample
from blendserve.engines.replay import LatencyModel, ReplayEngine
from blendserve.testing.command import serve_command
from blendserve.testing.live import LiveServer, serve_engine
from blendserve.testing.waiting import wait_until
from prometheus_client.parser import text_string_to_metric_families

from tests.support.errors import error_body

DATA = Path(__file__).parents[1] / "fixtures" / "replay_small.jsonl"
REPLAY = ("--engine", "replay", "--data", str(DATA))  # blendserve serve's arguments
RECORDS = [
    {"id": str(i), "prompt": f"What is {i} plus one?", "answers": [str(i + 1)] * 3 + ["0"]}
    for i in range(6)
]
LIMITS = {
    "max_questions_per_job": 3,
    "max_budget_per_job": 40,
    "max_budget_per_question": 10,
    "max_prompt_bytes": 100,
    "max_body_bytes": 4000,
}
STALLED = LatencyModel(fixed=600)
OFF = {"blendserve": {"enabled": False}}


def _questions(count: int, prompt: str = "x") -> list[dict[str, Any]]:
    return [{"id": str(i), "prompt": prompt} for i in range(count)]


def _chat(content: str = "What is 0 plus one?", budget: float = 3) -> dict[str, Any]:
    return {
        "model": "replay",
        "messages": [{"role": "user", "content": content}],
        "blendserve": {"answer": "number", "budget_per_question": budget},
    }


def _metric(url: str, name: str) -> float:
    """A sample's value on the service's ``/metrics``."""
    text = httpx.get(f"{url}/metrics", timeout=5).text
    families = text_string_to_metric_families(text)
    return next(s.value for f in families for s in f.samples if s.name == name)


def _idle(live: LiveServer) -> Callable[[], bool]:
    admission = live.service.admission
    return lambda: admission.jobs == 0 and admission.questions == 0


# --- shape limits: 422 naming the field ----------------------------------------------


@pytest.fixture(scope="module")
def limited() -> Iterator[LiveServer]:
    with serve_engine(ReplayEngine(RECORDS, seed=2), **LIMITS) as live:
        yield live


def _solve(url: str, **body: Any) -> httpx.Response:
    payload = {"answer": {"kind": "number"}, **body}
    return httpx.post(f"{url}/solve", json=payload, timeout=30)


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"questions": _questions(4), "budget": 8}, "questions"),
        ({"questions": _questions(3), "budget": 41}, "budget"),
        ({"questions": _questions(3), "budget": 31}, "budget"),  # 10.3 a question
        ({"questions": _questions(3), "budget_per_question": 10.5}, "budget_per_question"),
        ({"questions": _questions(2, "y" * 101), "budget": 4}, "questions.0.prompt"),
        ({"questions": _questions(2, "é" * 51), "budget": 4}, "questions.0.prompt"),  # bytes
        (
            {
                "questions": [
                    {"id": "0", "prompt": "x"},
                    {"id": "1", "messages": [{"role": "user", "content": "y" * 80}]},
                ],
                "budget": 4,
            },
            "questions.1.messages",
        ),
        ({"questions": _questions(1), "budget": 2, "colour": "red"}, "colour"),
        ({"questions": [{"id": "0", "prompt": "x", "size": 1}], "budget": 2}, "questions.0.size"),
        ({"questions": _questions(1), "budget": 0}, "budget"),
    ],
)
def test_solve_over_a_limit_is_422_naming_the_field(
    limited: LiveServer, body: dict[str, Any], param: str
) -> None:
    error = error_body(_solve(limited.url, **body), 422)
    assert error["param"] == param, error
    assert _idle(limited)()


def test_solve_at_every_limit_is_served(limited: LiveServer) -> None:
    prompt = "é" * 50  # 100 bytes
    response = _solve(limited.url, questions=_questions(3, prompt), budget=30)
    assert response.status_code == 200, response.text
    assert response.json()["budget"]["spent"] == 30


def test_a_body_that_is_not_json_is_422_without_a_param(limited: LiveServer) -> None:
    response = httpx.post(
        f"{limited.url}/solve",
        content=b'{"questions": [',
        headers={"content-type": "application/json"},
    )
    assert "param" not in error_body(response, 422)


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        ("/v1/chat/completions", _chat(budget=11), "blendserve.budget_per_question"),
        ("/v1/chat/completions", _chat("y" * 100), "messages"),
        ("/v1/chat/completions", {**_chat(), "blendserve": {"budgett": 3}}, "blendserve.budgett"),
        (
            "/v1/completions",
            {"model": "replay", "prompt": ["What is 0 plus one?"] * 4},
            "prompt",
        ),
        ("/v1/completions", {"model": "replay", "prompt": ["x", "y" * 101]}, "prompt.1"),
        ("/v1/completions", {"model": "replay", "prompt": "y" * 101}, "prompt"),
        # Self-consistency off: the replay engine's plain samples obey the same limits.
        ("/v1/completions", {"model": "replay", "prompt": ["x"] * 4, **OFF}, "prompt"),
        ("/v1/completions", {"model": "replay", "prompt": "x", "n": 11, **OFF}, "n"),
        ("/v1/chat/completions", {**_chat("y" * 100), **OFF}, "messages"),
    ],
)
def test_v1_over_a_limit_is_422_naming_the_field(
    limited: LiveServer, path: str, body: dict[str, Any], param: str
) -> None:
    error = error_body(httpx.post(f"{limited.url}{path}", json=body, timeout=30), 422)
    assert error["param"] == param, error


def test_the_openai_client_sees_the_field_of_a_422(limited: LiveServer) -> None:
    client = openai.OpenAI(base_url=f"{limited.url}/v1", api_key="-", max_retries=0)
    with client, pytest.raises(openai.UnprocessableEntityError) as raised:
        client.chat.completions.create(
            model="replay",
            messages=[{"role": "user", "content": "What is 0 plus one?"}],
            extra_body={"blendserve": {"budget_per_question": 12}},
        )
    assert raised.value.param == "blendserve.budget_per_question"


# --- request body size: 413 ------------------------------------------------------


def _big_body(size: int) -> bytes:
    body = json.dumps({"questions": _questions(1), "budget": 2, "model": ""}).encode()
    padding = size - len(body)
    return body.replace(b'"model": ""', b'"model": "' + b"m" * padding + b'"')


def test_a_declared_body_over_the_limit_is_413(limited: LiveServer) -> None:
    body = _big_body(4001)
    response = httpx.post(
        f"{limited.url}/solve", content=body, headers={"content-type": "application/json"}
    )
    error = error_body(response, 413)
    assert error["type"] == "invalid_request_error" and "4000" in error["message"]


def test_a_streamed_body_over_the_limit_is_413(limited: LiveServer) -> None:
    body = _big_body(4001)

    def chunks() -> Iterator[bytes]:
        for start in range(0, len(body), 500):
            yield body[start : start + 500]

    response = httpx.post(
        f"{limited.url}/solve", content=chunks(), headers={"content-type": "application/json"}
    )
    assert "content-length" not in response.request.headers
    assert response.request.headers["transfer-encoding"] == "chunked"
    error_body(response, 413)


@pytest.mark.parametrize("streamed", [False, True])
def test_a_body_at_the_limit_is_served(limited: LiveServer, streamed: bool) -> None:
    body = _big_body(4000)
    content: bytes | Iterator[bytes] = iter([body[:1000], body[1000:]]) if streamed else body
    response = httpx.post(
        f"{limited.url}/solve", content=content, headers={"content-type": "application/json"}
    )
    assert response.status_code == 200, response.text
    assert response.json()["answers"][0]["answer"] == "1"


# --- admission: 429 with Retry-After, slots given back ----------------------------------


@pytest.fixture
def engine() -> ReplayEngine:
    return ReplayEngine(RECORDS, seed=3, latency=STALLED)


@pytest.fixture
def admitting(engine: ReplayEngine) -> Iterator[LiveServer]:
    with serve_engine(engine, max_concurrent_jobs=2, max_queued_questions=4) as live:
        yield live


@contextmanager
def _held(live: LiveServer, questions: int, path: str = "/solve") -> Iterator[httpx.Response]:
    """A streamed job on the stalled engine, open until the block ends (then abandoned)."""
    if path == "/solve":
        body: dict[str, Any] = {"questions": _questions(questions), "budget": 2 * questions,
                                "stream": True}  # fmt: skip
    else:
        body = {**_chat(), "stream": True}
    admission = live.service.admission
    before = admission.jobs
    with httpx.stream("POST", f"{live.url}{path}", json=body, timeout=30) as response:
        assert response.status_code == 200
        wait_until(lambda: admission.jobs == before + 1, 15, "the job to be admitted")
        yield response


def _assert_429(response: httpx.Response) -> dict[str, Any]:
    error = error_body(response, 429)
    assert int(response.headers["retry-after"]) >= 1
    return error


def test_jobs_over_the_limit_are_429_with_retry_after(
    admitting: LiveServer, engine: ReplayEngine
) -> None:
    with _held(admitting, 1), _held(admitting, 1):
        response = _solve(admitting.url, questions=_questions(1), budget=2)
        assert "jobs" in _assert_429(response)["message"]
        _assert_429(httpx.post(f"{admitting.url}/v1/chat/completions", json=_chat()))
        stream = httpx.post(
            f"{admitting.url}/v1/chat/completions", json={**_chat(), "stream": True}
        )
        _assert_429(stream)
        completion = {"model": "replay", "prompt": "What is 1 plus one?"}
        _assert_429(httpx.post(f"{admitting.url}/v1/completions", json=completion))
        assert admitting.service.admission.jobs == 2
    wait_until(_idle(admitting), 15, "the abandoned jobs to give their slots back")
    engine.latency = LatencyModel()
    response = _solve(admitting.url, questions=_questions(2), budget=4)
    assert response.status_code == 200 and response.json()["status"] == "completed"


def test_queued_questions_over_the_limit_are_429(admitting: LiveServer) -> None:
    with _held(admitting, 3):
        error = _assert_429(_solve(admitting.url, questions=_questions(2), budget=4))
        assert "questions" in error["message"]
        completion = {"model": "replay", "prompt": ["What is 1 plus one?", "What is 2 plus one?"]}
        _assert_429(httpx.post(f"{admitting.url}/v1/completions", json=completion))
        with _held(admitting, 1):  # exactly the fourth question still fits
            assert admitting.service.admission.questions == 4
    wait_until(_idle(admitting), 15, "the slots to be given back")


def test_more_questions_than_ever_fit_are_422_not_429(admitting: LiveServer) -> None:
    response = _solve(admitting.url, questions=_questions(5), budget=5)
    assert error_body(response, 422)["param"] == "questions"
    assert "retry-after" not in response.headers


def test_the_openai_client_raises_rate_limiterror_body(admitting: LiveServer) -> None:
    client = openai.OpenAI(base_url=f"{admitting.url}/v1", api_key="-", max_retries=0)
    held = _held(admitting, 1), _held(admitting, 1, "/v1/chat/completions")
    with held[0], held[1], client, pytest.raises(openai.RateLimitError) as raised:
        client.chat.completions.create(
            model="replay", messages=[{"role": "user", "content": "What is 0 plus one?"}]
        )
    assert raised.value.status_code == 429
    assert raised.value.response.headers["retry-after"] == "1"
    wait_until(_idle(admitting), 15, "the slots to be given back")


def _raw_request(url: str, path: str, body: dict[str, Any]) -> socket.socket:
    """A request on a bare socket, so the test decides when the client goes away."""
    host, port = url.removeprefix("http://").split(":")
    payload = json.dumps(body).encode()
    sock = socket.create_connection((host, int(port)), timeout=10)
    head = (
        f"POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(payload)}\r\n\r\n"
    )
    sock.sendall(head.encode() + payload)
    return sock


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/solve", {"questions": _questions(2), "budget": 4}),
        ("/solve", {"questions": _questions(2), "budget": 4, "stream": True}),
        ("/v1/chat/completions", _chat()),
        ("/v1/chat/completions", {**_chat(), "stream": True}),
        ("/v1/completions", {"model": "replay", "prompt": ["What is 1 plus one?"] * 2}),
    ],
)
def test_a_client_that_leaves_gives_its_slots_back(
    admitting: LiveServer, path: str, body: dict[str, Any]
) -> None:
    admission = admitting.service.admission
    sock = _raw_request(admitting.url, path, body)
    wait_until(
        lambda: admission.jobs == 1 and admission.questions > 0, 15, "the job to be admitted"
    )
    sock.close()
    wait_until(_idle(admitting), 15, "the slots to be given back")


def test_an_abandoned_ndjson_stream_gives_its_slots_back(admitting: LiveServer) -> None:
    body = {"questions": _questions(2), "budget": 4}
    headers = {"accept": "application/x-ndjson"}
    url = f"{admitting.url}/solve"
    with httpx.stream("POST", url, json=body, headers=headers, timeout=30) as response:
        assert response.headers["content-type"].startswith("application/x-ndjson")
        wait_until(lambda: admitting.service.admission.jobs == 1, 15, "the job to be admitted")
    wait_until(_idle(admitting), 15, "the slots to be given back")


def test_finished_jobs_give_their_slots_back() -> None:
    engine = ReplayEngine(RECORDS, seed=4)
    with serve_engine(engine, max_concurrent_jobs=1, max_queued_questions=3) as live:
        calls: list[tuple[str, dict[str, Any], dict[str, str]]] = [
            ("/solve", {"questions": _questions(3), "budget": 6}, {}),
            ("/solve", {"questions": _questions(3), "budget": 6, "stream": True}, {}),
            ("/solve", {"questions": _questions(3), "budget": 6},
             {"accept": "application/x-ndjson"}),
            ("/v1/chat/completions", _chat(), {}),
            ("/v1/chat/completions", {**_chat(), "stream": True}, {}),
            ("/v1/completions", {"model": "replay", "prompt": ["What is 1 plus one?"] * 3}, {}),
        ]  # fmt: skip
        for _ in range(2):
            for path, body, headers in calls:
                response = httpx.post(f"{live.url}{path}", json=body, headers=headers, timeout=30)
                assert response.status_code == 200, (path, response.text)
                # A stream's slot goes back just after its last byte: poll, not sleep.
                wait_until(_idle(live), 15, f"{path} to give its slots back")


class _GatedReplay(ReplayEngine):
    """Replay whose requests for ``gated`` wait until the test calls :meth:`open`."""

    def __init__(self, gated: str) -> None:
        super().__init__(RECORDS, seed=5)
        self.gated = gated
        self._gate: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    async def replay_stream(self, request: GenerateRequest, kind: str) -> AsyncIterator[Sample]:
        if request.prompt == self.gated:
            if self._gate is None:
                self._loop, self._gate = asyncio.get_running_loop(), asyncio.Event()
            await self._gate.wait()
        async for sample in super().replay_stream(request, kind):
            yield sample

    def open(self) -> None:
        """Lets the gated requests through (from the test's thread)."""
        if self._loop is not None and self._gate is not None:
            self._loop.call_soon_threadsafe(self._gate.set)


@pytest.mark.parametrize("stream", [False, True])
def test_grouped_v1_questions_give_their_admission_back_as_they_are_answered(
    stream: bool,
) -> None:
    fast, slow, other = (RECORDS[i]["prompt"] for i in (1, 2, 3))
    engine = _GatedReplay(gated=slow)
    # One group of exactly these three questions: it starts when the third comes in.
    grouped = {"sc_mode": "grouped", "group_wait_ms": 60_000, "group_max": 3}
    with serve_engine(engine, **grouped) as live, ThreadPoolExecutor(2) as pool:
        admission = live.service.admission
        options = {"blendserve": {"answer": "number", "budget_per_question": 2}}
        both = {"model": "replay", "prompt": [fast, slow], "stream": stream, **options}
        alone = {"model": "replay", "prompt": other, **options}
        url = f"{live.url}/v1/completions"
        waiting = pool.submit(httpx.post, url, json=both, timeout=30)
        try:
            wait_until(lambda: admission.questions == 2, 15, "the two-question request admitted")
            answered = pool.submit(httpx.post, url, json=alone, timeout=30).result()
            assert answered.status_code == 200, answered.text
            # The group job runs on, its slow question held at the engine: the request
            # that was answered holds nothing, and the other holds only that question.
            wait_until(lambda: admission.questions == 1, 15, "the fast question's slot back")
            assert admission.jobs == 1 and not waiting.done()
        finally:
            engine.open()
        response = waiting.result()
        assert response.status_code == 200, response.text
        wait_until(_idle(live), 15, "every slot given back")


# --- graceful shutdown of the real command ------------------------------------------------


def _refuses_connections(url: str) -> bool:
    host, port = url.removeprefix("http://").split(":")
    try:
        with socket.create_connection((host, int(port)), timeout=1):
            return False
    except ConnectionRefusedError:
        return True
    except OSError:  # reset in the backlog as the listener closed, or timed out: ask again
        return False


def _events(response: httpx.Response) -> list[tuple[str, dict[str, Any]]]:
    events, name = [], ""
    for line in response.iter_lines():
        if line.startswith("event: "):
            name = line.removeprefix("event: ")
        elif line.startswith("data: "):
            events.append((name, json.loads(line.removeprefix("data: "))))
    return events


SHUTDOWN_JOB = {
    "questions": [{"id": "q-easy", "prompt": "x"}, {"id": "q-split", "prompt": "y"}],
    "budget": 4,
    "concurrency": 2,  # two rounds of requests: the job takes about twice the latency
    "answer": {"kind": "number"},
    "stream": True,
}
OVER_GRACE = ("--replay-latency-s", "300", "--shutdown-grace-s", "1")  # jobs outlast the grace


@pytest.mark.slow
def test_sigterm_lets_a_running_job_finish_then_exits_0() -> None:
    grace = 30
    args = ("--replay-latency-s", "2", "--shutdown-grace-s", str(grace))
    with serve_command(*REPLAY, *args) as (url, process):
        with httpx.stream("POST", f"{url}/solve", json=SHUTDOWN_JOB, timeout=30) as response:
            assert response.status_code == 200
            terminated = time.monotonic()
            process.send_signal(signal.SIGTERM)
            wait_until(lambda: _refuses_connections(url), 15, "new connections to be refused")
            assert process.poll() is None  # refusing new work while the job still runs
            events = _events(response)
        answers = {data["id"]: data for name, data in events if name == "answer"}
        assert answers["q-easy"]["answer"] == "42" and answers["q-split"]["samples"] == 2
        (done,) = [data for name, data in events if name == "done"]
        assert done["status"] == "completed" and done["budget"]["spent"] == 4
        assert process.wait(timeout=grace) == 0
        assert time.monotonic() - terminated < grace
        stderr = process.communicate()[1]
    assert "Traceback" not in stderr, stderr


@pytest.mark.slow
def test_sigterm_ends_a_stream_longer_than_the_grace_with_partial_answers() -> None:
    with serve_command(*REPLAY, *OVER_GRACE) as (url, process):
        with httpx.stream("POST", f"{url}/solve", json=SHUTDOWN_JOB, timeout=60) as response:
            assert response.status_code == 200
            terminated = time.monotonic()
            process.send_signal(signal.SIGTERM)
            events = _events(response)
            cut = time.monotonic() - terminated
        answers = [data for name, data in events if name == "answer"]
        assert len(answers) == 2 and all(a["partial"] for a in answers)
        (done,) = [data for name, data in events if name == "done"]
        assert done["status"] == "cancelled" and "shutting down" in done["error"]
        assert done["budget"]["spent"] == 0  # the cancelled samples were refunded
        assert 1 <= cut < 15, cut
        assert process.wait(timeout=15) == 0
        stderr = process.communicate()[1]
    assert "Traceback" not in stderr, stderr


@pytest.mark.slow
def test_sigterm_answers_a_json_job_longer_than_the_grace_as_cancelled() -> None:
    job = {**SHUTDOWN_JOB, "stream": False}
    with serve_command(*REPLAY, *OVER_GRACE) as (url, process):
        with ThreadPoolExecutor(1) as pool:
            pending = pool.submit(httpx.post, f"{url}/solve", json=job, timeout=60)
            wait_until(lambda: _metric(url, "blendserve_active_jobs") == 1, 15, "the job to start")
            process.send_signal(signal.SIGTERM)
            response = pending.result()
        assert response.status_code == 200, response.text
        body = response.json()
        assert body["status"] == "cancelled"
        assert [a["partial"] for a in body["answers"]] == [True, True]
        assert process.wait(timeout=15) == 0
        stderr = process.communicate()[1]
    assert "Traceback" not in stderr, stderr


@pytest.mark.slow
def test_sigterm_answers_pool_questions_past_the_grace_with_partial_answers() -> None:
    # /v1's default: the question joins an always-open pool, which gets the grace as jobs do.
    body = {"prompt": "What is 6 times 7?", "blendserve": {"answer": "number"}}
    with serve_command(*REPLAY, *OVER_GRACE) as (url, process):
        with ThreadPoolExecutor(1) as pool:
            pending = pool.submit(httpx.post, f"{url}/v1/completions", json=body, timeout=60)
            wait_until(
                lambda: _metric(url, "blendserve_in_flight_samples") > 0, 15, "samples in flight"
            )
            terminated = time.monotonic()
            process.send_signal(signal.SIGTERM)
            response = pending.result()
            cut = time.monotonic() - terminated
        assert response.status_code == 200, response.text
        votes = response.json()["blendserve"][0]
        assert votes["partial"] and votes["samples"] == 0 and not votes["settled_early"]
        assert 1 <= cut < 15, cut
        assert process.wait(timeout=15) == 0
        stderr = process.communicate()[1]
    assert "Traceback" not in stderr, stderr


@pytest.mark.slow
def test_sigterm_ends_a_quality_target_stream_past_the_grace_with_partial_answers() -> None:
    job = {k: v for k, v in SHUTDOWN_JOB.items() if k != "budget"} | {"confidence": 0.9}
    with serve_command(*REPLAY, *OVER_GRACE) as (url, process):
        with httpx.stream("POST", f"{url}/solve", json=job, timeout=60) as response:
            assert response.status_code == 200
            process.send_signal(signal.SIGTERM)
            events = _events(response)
        answers = [data for name, data in events if name == "answer"]
        assert sorted(a["id"] for a in answers) == ["q-easy", "q-split"]
        assert all(a["partial"] and a["samples"] == 0 for a in answers)
        (done,) = [data for name, data in events if name == "done"]
        assert done["status"] == "cancelled" and "shutting down" in done["error"]
        assert done["budget"] == {"total": 128, "spent": 0, "unspent": 128}
        assert process.wait(timeout=15) == 0
        stderr = process.communicate()[1]
    assert "Traceback" not in stderr, stderr
