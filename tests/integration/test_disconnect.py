"""A client that leaves cancels its job's upstream requests within a second.

blendserve runs on uvicorn with the OpenAI engine in front of a slow fake
upstream (``blendserve.testing.fake_openai``, not a model) that counts the
requests it is working on. The client is a plain TCP socket, so that the
moment it leaves is exactly when the test closes it.
"""

import json
import socket
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from blendserve.engines.openai import OpenAIEngine
from blendserve.service import Settings, create_app
from blendserve.testing.accounting import assert_accounting
from blendserve.testing.fake_openai import FakeServer, FakeState
from blendserve.testing.live import LiveServer
from blendserve.testing.waiting import wait_until

pytestmark = pytest.mark.slow

QUESTIONS = [{"id": f"q{i}", "prompt": f"question {i}?"} for i in range(3)]
MESSAGES = [{"role": "user", "content": "Three?"}]
V1 = {"blendserve": {"answer": "number", "budget_per_question": 16}}

CASES = {
    "solve-json": ("/solve", {"questions": QUESTIONS, "budget": 30}),
    "solve-sse": ("/solve", {"questions": QUESTIONS, "budget": 30, "stream": True}),
    "v1-chat": ("/v1/chat/completions", {"model": "fake-model", "messages": MESSAGES, **V1}),
    "v1-chat-stream": (
        "/v1/chat/completions",
        {"model": "fake-model", "messages": MESSAGES, "stream": True, **V1},
    ),
    "v1-completions": ("/v1/completions", {"model": "fake-model", "prompt": ["a?", "b?"], **V1}),
}


@pytest.fixture(scope="module")
def upstream() -> Iterator[FakeServer]:
    server = FakeServer(FakeState(name="slow", latency=60.0, record=False)).start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def live(upstream: FakeServer) -> Iterator[LiveServer]:
    engine = OpenAIEngine([upstream.url])

    async def factory() -> OpenAIEngine:
        return engine

    settings = Settings(default_concurrency=4, group_wait_ms=0)
    with LiveServer(create_app(settings, engine_factory=factory)) as server:
        yield server


def _request(live: LiveServer, path: str, body: dict[str, Any]) -> bytes:
    url = httpx.URL(live.url)
    payload = json.dumps(body).encode()
    head = (
        f"POST {path} HTTP/1.1\r\nHost: {url.host}:{url.port}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(payload)}\r\n\r\n"
    )
    return head.encode() + payload


@pytest.mark.parametrize("case", list(CASES))
def test_a_client_that_leaves_drops_upstream_requests_within_a_second(
    case: str, upstream: FakeServer, live: LiveServer
) -> None:
    path, body = CASES[case]
    state = upstream.state
    before = (state.samples_served, state.disconnects)
    url = httpx.URL(live.url)
    with socket.create_connection((url.host, url.port or 80), timeout=10) as client:
        client.sendall(_request(live, path, body))
        # the job runs: requests are upstream
        wait_until(lambda: state.in_flight > 0, 10, "requests upstream")
        in_flight = state.in_flight
    # The socket is closed: the client has left.
    took = wait_until(lambda: state.in_flight == 0, 5, "the upstream requests to drop")
    print(f"\n{case}: {in_flight} upstream requests dropped {took * 1000:.0f} ms after leaving")
    assert took < 1.0
    assert state.samples_served == before[0]  # nothing was generated for nobody
    assert state.disconnects - before[1] >= in_flight
    assert_accounting(live.url, [upstream.url])
