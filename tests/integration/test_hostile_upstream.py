"""Upstreams that hold, flood or throttle, upstream credentials, and pass-through limits.

The real service on loopback over the OpenAI engine, in front of the fake upstream
(:mod:`blendserve.testing.fake_openai`, a real HTTP server that runs no model) set to
misbehave.
"""

import asyncio
import base64
import contextlib
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest
from blendserve.engines.config import Limits, RetryPolicy, Timeouts
from blendserve.engines.openai import OpenAIEngine
from blendserve.errors import EngineProtocolError
from blendserve.service import Settings, create_app
from blendserve.service.limits import Admission
from blendserve.testing.accounting import assert_accounting
from blendserve.testing.fake_openai import FakeServer, FakeState
from blendserve.testing.live import LiveServer, serve_engine
from blendserve.testing.stats import RecordingStats
from blendserve.testing.waiting import wait_until

pytestmark = pytest.mark.slow

OFF = {"blendserve": {"enabled": False}}
CHAT = {"model": "fake-model", "messages": [{"role": "user", "content": "What is 6 * 7?"}]}
SOLVE = {"questions": [{"id": "q", "messages": CHAT["messages"]}], "budget": 2}


@pytest.fixture
def fake() -> Iterator[FakeServer]:
    server = FakeServer(FakeState(name="up", answers=("42",))).start()
    try:
        yield server
    finally:
        server.kill()


def _serve_settings(**settings: Any) -> LiveServer:
    """The service as ``blendserve serve`` builds it from its settings (engine included)."""
    config = Settings(**{"default_concurrency": 2, "group_wait_ms": 0, **settings})
    return LiveServer(create_app(config), connections=config.connection_timeouts())


# --- pass-through ----------------------------------------------------------------------


def test_pass_through_requests_count_against_the_job_limit(fake: FakeServer) -> None:
    fake.state.latency = 30  # holds every request until the test ends
    engine = OpenAIEngine([fake.url])
    with serve_engine(engine, max_concurrent_jobs=2) as live, ThreadPoolExecutor(2) as pool:
        admission: Admission = live.service.admission

        def post() -> None:
            with contextlib.suppress(httpx.HTTPError):  # cut when the upstream goes away
                httpx.post(f"{live.url}/v1/chat/completions", json={**CHAT, **OFF}, timeout=60)

        held = [pool.submit(post) for _ in range(2)]
        wait_until(lambda: admission.jobs == 2, 10, "two pass-through requests admitted")
        third = httpx.post(f"{live.url}/v1/chat/completions", json={**CHAT, **OFF}, timeout=10)
        assert third.status_code == 429, third.text
        assert "Retry-After" in third.headers
        fake.kill()  # the held requests end (a dropped upstream)
        for future in held:
            future.result(timeout=30)
        wait_until(lambda: admission.jobs == 0, 10, "the slots given back")
        assert_accounting(live.url, engine.urls)


def test_a_pass_through_to_a_silent_upstream_ends_at_the_read_timeout(fake: FakeServer) -> None:
    fake.state.latency = 60
    engine = OpenAIEngine([fake.url], timeouts=Timeouts(call=1.0))
    with serve_engine(engine) as live:
        start = time.monotonic()
        response = httpx.post(f"{live.url}/v1/chat/completions", json={**CHAT, **OFF}, timeout=30)
        assert response.status_code == 503, response.text
        assert time.monotonic() - start < 10
        assert live.service.admission.jobs == 0
        assert_accounting(live.url, engine.urls)


def test_a_pass_through_reply_is_cut_at_the_response_size_limit(fake: FakeServer) -> None:
    fake.state.endless = True
    engine = OpenAIEngine([fake.url], limits=Limits(response_bytes=1 << 20))
    with serve_engine(engine) as live:
        received = 0
        request = {**CHAT, **OFF, "stream": True}
        with (
            pytest.raises(httpx.RemoteProtocolError),  # cut, not ended cleanly
            httpx.stream(
                "POST", f"{live.url}/v1/chat/completions", json=request, timeout=30
            ) as response,
        ):
            for chunk in response.iter_raw():
                received += len(chunk)
                assert received < 4 << 20, "the endless reply was relayed on"
        wait_until(lambda: live.service.admission.jobs == 0, 10, "the slot given back")
        assert_accounting(live.url, engine.urls)


# --- upstreams that flood ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("max_tokens", "piece", "error"),
    [
        (None, 4096, "over 1048576 bytes"),  # nothing but the size limit bounds it
        # Every piece holds a token at least: past twice max_tokens the stream is running
        # away, and reading on to the size limit would cost CPU per byte for nothing.
        (100, 4, "runaway stream"),
    ],
)
def test_an_endless_streamed_sample_fails_at_its_max_tokens_else_the_size_limit(
    fake: FakeServer, max_tokens: int | None, piece: int, error: str
) -> None:
    fake.state.endless = True
    fake.state.endless_piece = piece
    stats = RecordingStats()

    async def scenario() -> None:
        engine = OpenAIEngine(
            [fake.url],
            stream=True,
            timeouts=Timeouts(stall=5),
            limits=Limits(response_bytes=1 << 20),
            retry=RetryPolicy(max_retries=0),
        )
        engine.report_to(stats)
        async with engine:
            from blendserve.engines.base import GenerateRequest, SamplingParams

            request = GenerateRequest(prompt="x", params=SamplingParams(max_tokens=max_tokens))
            with pytest.raises(EngineProtocolError, match=error):
                await engine.generate(request)

    start = time.monotonic()
    asyncio.run(scenario())
    assert time.monotonic() - start < 10
    assert assert_accounting(stats).total("failed") == 1


def test_a_huge_completion_fails_at_the_size_limit(fake: FakeServer) -> None:
    fake.state.pad_bytes = 2 << 20
    stats = RecordingStats()

    async def scenario() -> None:
        async with OpenAIEngine(
            [fake.url], limits=Limits(response_bytes=1 << 20), retry=RetryPolicy(max_retries=0)
        ) as engine:
            engine.report_to(stats)
            from blendserve.engines.base import GenerateRequest

            with pytest.raises(EngineProtocolError, match="over 1048576 bytes"):
                await engine.generate(GenerateRequest(prompt="x"))
            fake.state.pad_bytes = 1000  # under the limit: served
            assert len(await engine.generate(GenerateRequest(prompt="x"))) == 1

    asyncio.run(scenario())
    accounting = assert_accounting(stats)
    assert accounting.total("failed") == accounting.total("completed") == 1


def test_a_retry_after_longer_than_the_failure_timeout_fails_the_job_in_time(
    fake: FakeServer,
) -> None:
    fake.state.retry_after = "999999"
    with _serve_settings(upstreams=(fake.url,), job_failure_timeout=1.0) as live:
        start = time.monotonic()
        response = httpx.post(f"{live.url}/solve", json=SOLVE, timeout=60)
        elapsed = time.monotonic() - start
        assert_accounting(live.url, [fake.url])
    assert response.status_code == 200, response.text
    assert response.json()["status"] == "failed"
    assert elapsed < 15, f"the job outlived its failure timeout by {elapsed:.0f} s"


# --- credentials in an upstream URL -------------------------------------------------------


def test_upstream_credentials_are_sent_as_basic_auth_and_never_shown(fake: FakeServer) -> None:
    secret = "s3cret-pw"
    url = fake.url.replace("http://", f"http://alice:{secret}@")
    with _serve_settings(upstreams=(url,), job_failure_timeout=1.0) as live:
        solved = httpx.post(
            f"{live.url}/solve", json={**SOLVE, "answer": {"kind": "number"}}, timeout=30
        )
        assert solved.status_code == 200 and solved.json()["answers"][0]["answer"] == "42"
        expected = "Basic " + base64.b64encode(f"alice:{secret}".encode()).decode()
        assert fake.state.authorizations and set(fake.state.authorizations) == {expected}
        health = httpx.get(f"{live.url}/health", timeout=10)
        assert health.json()["upstreams"] == {fake.url: True}
        shown = [health.text, httpx.get(f"{live.url}/metrics", timeout=10).text]
        fake.state.retry_after = "999999"  # errors that name the upstream
        shown.append(httpx.post(f"{live.url}/solve", json=SOLVE, timeout=60).text)
        chat = {**CHAT, "blendserve": {"answer": "number", "budget_per_question": 2}}
        shown.append(httpx.post(f"{live.url}/v1/chat/completions", json=chat, timeout=60).text)
        assert_accounting(live.url, [fake.url])
    assert fake.url in shown[1]  # the metrics label is the URL without its credentials
    assert f"{fake.url}/chat/completions answered 429" in shown[2]
    assert f"{fake.url}/chat/completions answered 429" in shown[3]
    for text in shown:
        assert secret not in text and "alice" not in text
