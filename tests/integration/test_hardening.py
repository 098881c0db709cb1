"""Fourth hostile pass: what a load balancer or an operator's typo must not break."""

import json
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import httpx2
import pytest
from blendserve.engines.base import GenerateRequest, Sample, SamplingParams
from blendserve.engines.config import RetryPolicy, Timeouts
from blendserve.engines.openai import OpenAIEngine
from blendserve.engines.openai._replicas import BreakerState
from blendserve.engines.replay import ReplayEngine
from blendserve.errors import EngineUnavailable
from blendserve.testing.accounting import assert_accounting
from blendserve.testing.fake_openai import FakeServer, FakeState
from blendserve.testing.live import serve_engine
from blendserve.testing.stats import RecordingStats

from tests.support.running import run_coroutine


def test_head_health_answers_as_get_does() -> None:
    """Load balancers that probe with HEAD must not mark the service down."""
    with serve_engine(ReplayEngine([{"id": "q", "answers": ["1"]}])) as live:
        head = httpx.head(f"{live.url}/health", timeout=10)
        get = httpx.get(f"{live.url}/health", timeout=10)
    assert head.status_code == get.status_code == 200
    assert head.content == b""


@pytest.mark.parametrize(
    ("flag", "value", "setting"),
    [("--log-level", "bogus", "log_level"), ("--sympy-workers", "100000", "sympy_workers")],
)
def test_a_bad_serve_flag_is_one_line_and_exit_2(flag: str, value: str, setting: str) -> None:
    command = [sys.executable, "-m", "blendserve.cli", "serve", flag, value]
    done = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and setting in lines[0] and "Traceback" not in done.stderr


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"budget": 2}, "budget"),
        ({"budget_per_question": 0.5}, "budget_per_question"),
        ({"budget": 10, "sampling": {"stop": 5}}, "sampling.stop"),
        ({"budget": 10, "sampling": {"stop": [5]}}, "sampling.stop"),
    ],
)
def test_a_422_names_the_field_the_caller_sent(body: dict[str, object], param: str) -> None:
    questions = [{"prompt": f"question {i}"} for i in range(3)]
    with serve_engine(ReplayEngine([{"id": "q", "answers": ["1"]}])) as live:
        response = httpx.post(f"{live.url}/solve", json={"questions": questions, **body})
    assert response.status_code == 422
    error = response.json()["error"]
    assert error["param"] == param and error["message"].startswith(f"{param}: ")


def test_a_half_open_breaker_closes_on_an_upstream_that_ignores_n() -> None:
    """The single requests of an ``n > 1`` request wait for the trial, not fail and cancel it."""
    fake = FakeServer(FakeState(name="ignores-n", honour_n=False)).start()
    stats = RecordingStats()

    async def scenario() -> int:
        engine = OpenAIEngine([fake.url], retry=RetryPolicy(max_retries=4))
        engine.report_to(stats)
        try:
            await engine.generate(_request(2))  # learns that the upstream ignores n
            fake.state.fail_next = 3
            with pytest.raises(EngineUnavailable):
                await engine.generate(_request(1))  # three 500s open the breaker
            replica = engine._replicas.replicas[0]
            assert replica.state is BreakerState.OPEN
            await engine._upstreams._probe(replica)  # the upstream is back: half-open
            assert replica.state is BreakerState.HALF_OPEN
            samples = await engine.generate(_request(4))
            assert replica.state is BreakerState.CLOSED
            return len(samples)
        finally:
            await engine.aclose()

    try:
        assert run_coroutine(scenario()) == 4
    finally:
        fake.stop()
    accounting = assert_accounting(stats)
    assert accounting.total("failed") == 3 and accounting.total("cancelled") > 0


def _request(n: int) -> GenerateRequest:
    return GenerateRequest(prompt="What is 6 * 7?", n=n, params=SamplingParams(max_tokens=8))


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--engine", "replay", "--data", "{bad}"], "bad.jsonl:2: not UTF-8"),
        (["--upstreams", "http://a/v1,http://a"], "an upstream is given twice"),
        (["--upstreams", "ftp://a"], "not an http(s) base URL"),
    ],
)
def test_bad_data_or_upstreams_are_one_line_and_exit_2(
    args: list[str], says: str, tmp_path: Path
) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_bytes(b'{"id": "q", "answers": ["1"]}\n\xff\xfe\n')
    argv = [a.replace("{bad}", str(bad)) for a in args]
    command = [sys.executable, "-m", "blendserve.cli", "serve", "--port", "1", *argv]
    done = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and says in lines[0], done.stderr


@pytest.mark.parametrize(
    ("content", "flags", "says"),
    [
        (b'{"prompt": "a"}\n\xff\xfe\n', ["--budget", "4"], "q.jsonl:2: not UTF-8"),
        (b"[" * 100_000 + b"\n", ["--budget", "4"], "q.jsonl:1: JSON nested too deep"),
        (b"1" * 5000 + b"\n", ["--budget", "4"], "q.jsonl:1: Exceeds the limit"),
        (b'{"prompt": "a"}\n', ["--confidence", "nan"], "not a finite number"),
        (b'{"prompt": "a"}\n', ["--budget-per-question", "inf"], "not a finite number"),
        (b'{"prompt": "a"}\n', ["--budget", "4", "--temperature", "nan"], "not a finite number"),
    ],
)
def test_the_solve_command_refuses_bad_input_in_one_line(
    content: bytes, flags: list[str], says: str, tmp_path: Path
) -> None:
    questions = tmp_path / "q.jsonl"
    questions.write_bytes(content)
    command = [sys.executable, "-m", "blendserve.cli", "solve", str(questions), *flags]
    done = subprocess.run(
        [*command, "--url", "http://127.0.0.1:1"], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr and says in done.stderr.strip().splitlines()[-1]


@pytest.mark.parametrize("route", ["/solve", "/v1/chat/completions"])
def test_a_hung_upstream_ends_a_request_within_its_timeout_and_the_failure_timeout(
    route: str,
) -> None:
    """Not after ``max_consecutive_failures`` request timeouts (8 x 2 s here, before)."""
    fake = FakeServer(FakeState(name="hung", timeout_rate=1.0)).start()
    engine = OpenAIEngine([fake.url], retry=RetryPolicy(max_retries=0))
    question = {"role": "user", "content": "What is 6 * 7?"}
    bodies = {
        "/solve": {"questions": [{"messages": [question]}], "budget": 4},
        "/v1/chat/completions": {"model": "fake-model", "messages": [question]},
    }
    try:
        with serve_engine(engine, upstream_timeout=2.0, job_failure_timeout=1.0) as live:
            started = time.monotonic()
            response = httpx.post(f"{live.url}{route}", json=bodies[route], timeout=60)
            elapsed = time.monotonic() - started
            assert_accounting(live.url, engine.urls)
    finally:
        fake.kill()
    assert response.status_code in (200, 502, 503, 504), response.text
    if route == "/solve" and response.status_code == 200:
        assert response.json()["status"] == "failed"
    assert elapsed < 2 * (2.0 + 1.0) + 2.0  # timeout + failure timeout, with room for a loaded box


def _nested(depth: int) -> bytes:
    return b"[" * depth + b"]" * depth


@pytest.mark.parametrize("stream", [False, True])
def test_a_reply_nested_too_deep_is_an_upstream_error_and_every_sample_is_accounted(
    stream: bool,
) -> None:
    """Not a bare 500 with a traceback, nor Python's words, nor samples that never end."""

    def upstream(request: httpx2.Request) -> httpx2.Response:
        deep = _nested(200_000)
        if stream and not request.url.path.endswith("/models"):
            events = b"data: " + deep + b"\n\ndata: [DONE]\n\n"
            headers = {"content-type": "text/event-stream"}
            return httpx2.Response(200, content=events, headers=headers)
        return httpx2.Response(200, content=deep, headers={"content-type": "application/json"})

    transport = httpx2.MockTransport(upstream)
    engine = OpenAIEngine(["http://up/v1"], transport=transport, stream=stream)
    chat = {"model": "m", "messages": [{"role": "user", "content": "6 * 7?"}]}
    with serve_engine(engine, allow_model_aliases=True) as live:
        v1 = httpx.post(f"{live.url}/v1/chat/completions", json=chat, timeout=60)
        solve = httpx.post(
            f"{live.url}/solve", json={"questions": [{"prompt": "6 * 7?"}], "budget": 4}, timeout=60
        )
        accounting = assert_accounting(live.url, engine.urls)
    assert v1.status_code == 502, v1.text
    assert v1.json()["error"]["type"] == "server_error"
    for reply in (v1, solve):
        assert "Traceback" not in reply.text and "attribute" not in reply.text
    assert accounting.total("dispatched") > 0


class _BuggyEngine(ReplayEngine):
    """An engine with a bug: what it raises is no engine error."""

    async def replay_stream(self, request: GenerateRequest, kind: str) -> AsyncIterator[Sample]:
        raise RuntimeError("a secret of the server's internals")
        yield  # an async generator, like the replay engine's


@pytest.mark.parametrize("route", ["/v1/chat/completions", "/solve"])
def test_a_bug_is_a_500_of_the_error_contract_without_internals(route: str) -> None:
    question = {"role": "user", "content": "6 * 7?"}
    bodies = {
        "/solve": {"questions": [{"messages": [question]}], "budget": 4},
        "/v1/chat/completions": {"model": "replay", "messages": [question]},
    }
    engine = _BuggyEngine([{"id": "q", "answers": ["1"]}])
    with serve_engine(engine) as live:
        response = httpx.post(f"{live.url}{route}", json=bodies[route], timeout=60)
        assert_accounting(live.url, [engine.name])
    assert "secret" not in response.text and "Traceback" not in response.text
    if response.status_code == 500:
        assert response.json()["error"]["type"] == "server_error"


@pytest.mark.parametrize(("upstream_status", "status"), [(400, 400), (404, 404), (401, 502)])
def test_an_upstream_refusing_the_request_is_answered_at_once_as_what_it_is(
    upstream_status: int, status: int
) -> None:
    asked: list[tuple[str, int]] = []

    def upstream(request: httpx2.Request) -> httpx2.Response:
        asked.append((request.url.path, json.loads(request.content)["seed"]))
        body = {"error": {"message": "max_tokens is too large for this model"}}
        return httpx2.Response(upstream_status, json=body)

    engine = OpenAIEngine(["http://up/v1"], transport=httpx2.MockTransport(upstream))
    chat = {"model": "m", "messages": [{"role": "user", "content": "6 * 7?"}]}
    with serve_engine(engine, allow_model_aliases=True) as live:
        v1 = httpx.post(f"{live.url}/v1/chat/completions", json=chat, timeout=60)
        completions = [seed for path, seed in asked if path.endswith("/completions")]
        solve = httpx.post(
            f"{live.url}/solve", json={"questions": [{"prompt": "6 * 7?"}], "budget": 4}, timeout=60
        )
        assert_accounting(live.url, engine.urls)
    assert v1.status_code == status and "max_tokens is too large" in v1.text
    # The wave's single requests, each asked once: not retried, no retry can help.
    assert completions and len(set(completions)) == len(completions)
    assert solve.json()["status"] == "failed" and "max_tokens is too large" in solve.text


def test_a_hung_pass_through_is_a_503_that_says_why() -> None:
    fake = FakeServer(FakeState(name="hung-pass", timeout_rate=1.0)).start()
    engine = OpenAIEngine([fake.url], timeouts=Timeouts(call=1.0))
    body = {
        "model": "fake-model",
        "messages": [{"role": "user", "content": "6 * 7?"}],
        "blendserve": {"enabled": False},
    }
    try:
        with serve_engine(engine) as live:
            reply = httpx.post(f"{live.url}/v1/chat/completions", json=body, timeout=60)
            assert_accounting(live.url, engine.urls)
    finally:
        fake.kill()
    assert reply.status_code == 503, reply.text
    message = reply.json()["error"]["message"]
    assert message.endswith(")") and "no answer in time" in message
