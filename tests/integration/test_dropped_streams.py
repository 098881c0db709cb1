"""Clients that drop their jobs mid-flight leave the upstream connection pool usable.

The real service on loopback over the OpenAI engine, in front of a fake upstream
(``tests/support/fake_openai.py``, a real HTTP server that runs no model) where half
the requests answer at once and half after 3 s. Rounds of streamed ``/solve``
jobs are dropped one event in (and non-streamed ones by client timeouts): each
drop cancels the job's upstream requests in whatever state the pool holds them,
connecting included. Then plain ``/v1`` requests must each answer at once, and
the in-flight gauge must come back to 0. httpcore 1.0.9 (encode/httpcore#1093)
left connections cancelled while connecting in its pools for good, and requests
that were given such a pool hung.
"""

import asyncio
import os
import random
from collections.abc import Iterator

import httpx
import pytest
from blendserve.engines.openai import OpenAIEngine
from prometheus_client.parser import text_string_to_metric_families

from tests.support.fake_openai import FakeServer, FakeState
from tests.support.live import LiveServer, serve_engine
from tests.support.waiting import wait_until

pytestmark = pytest.mark.slow

#: Dropped streamed jobs in all (the issue's figure is 200: BLENDSERVE_DROPPED_STREAMS=200).
STREAMS = int(os.environ.get("BLENDSERVE_DROPPED_STREAMS", "200"))
ROUND = 50  # jobs dropped at once
TIMED_OUT = 5  # non-streamed jobs per round whose clients give up
QUESTIONS = 20
PLAIN = 50
PLAIN_AT_ONCE = 10  # at least one request on each shard of the engine's pool
PLAIN_TIMEOUT_S = 2.0
ANSWERS = ("7", "8")
CHAT = {"model": "fake-model", "messages": [{"role": "user", "content": "7 or 8?"}]}


def _job(tag: str, stream: bool) -> dict[str, object]:
    questions = [
        {"id": f"{tag}-{i}", "messages": [{"role": "user", "content": f"{tag} question {i}?"}]}
        for i in range(QUESTIONS)
    ]
    return {"questions": questions, "budget": 16 * QUESTIONS, "stream": stream}


@pytest.fixture
def upstream() -> Iterator[FakeServer]:
    state = FakeState(name="split", answers=ANSWERS, slow_rate=0.5, slow_latency=3.0, record=False)
    server = FakeServer(state).start()
    try:
        yield server
    finally:
        server.kill()


async def _drop_stream(
    client: httpx.AsyncClient, url: str, body: dict[str, object], linger: float
) -> None:
    """Reads the job's first event, lingers ``linger`` s, then closes the connection."""
    async with client.stream("POST", f"{url}/solve", json=body) as response:
        assert response.status_code == 200, await response.aread()
        async for line in response.aiter_lines():
            if not line:  # the end of the first event
                break
        # The moment of leaving is spread over the job's first half second on purpose.
        await asyncio.sleep(linger)


async def _give_up(
    client: httpx.AsyncClient, url: str, body: dict[str, object], after: float
) -> None:
    """Posts a non-streamed job and gives up after ``after`` s."""
    with pytest.raises(httpx.TimeoutException):
        await client.post(f"{url}/solve", json=body, timeout=after)


async def _drop_jobs(url: str, streams: int) -> None:
    rng = random.Random(1093)
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=0)
    async with httpx.AsyncClient(limits=limits, timeout=30) as client:
        for start in range(0, streams, ROUND):
            count = min(ROUND, streams - start)
            await asyncio.gather(
                *(
                    _drop_stream(client, url, _job(f"s{start + i}", True), rng.uniform(0, 0.5))
                    for i in range(count)
                ),
                *(
                    _give_up(client, url, _job(f"t{start + i}", False), rng.uniform(0.1, 0.5))
                    for i in range(TIMED_OUT)
                ),
            )


async def _plain(url: str) -> list[float]:
    """Sends the plain requests, ``PLAIN_AT_ONCE`` at a time; each one's seconds to its answer."""
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=0)
    async with httpx.AsyncClient(limits=limits, timeout=PLAIN_TIMEOUT_S) as client:

        async def one() -> float:
            start = asyncio.get_running_loop().time()
            response = await client.post(f"{url}/v1/chat/completions", json=CHAT)
            assert response.status_code == 200, response.text
            return asyncio.get_running_loop().time() - start

        results: list[float | BaseException] = []
        for _ in range(0, PLAIN, PLAIN_AT_ONCE):
            wave = (one() for _ in range(PLAIN_AT_ONCE))
            results += await asyncio.gather(*wave, return_exceptions=True)
    hung = [r for r in results if isinstance(r, BaseException)]
    assert not hung, f"{len(hung)} of {PLAIN} plain requests failed, the first: {hung[0]!r}"
    return [r for r in results if isinstance(r, float)]


def _in_flight(live: LiveServer) -> float:
    text = httpx.get(f"{live.url}/metrics").text
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "blendserve_in_flight_samples":
                return sample.value
    raise AssertionError("no blendserve_in_flight_samples")


def test_dropped_jobs_leave_the_upstream_pool_usable(upstream: FakeServer) -> None:
    # 8 shards of 2 connections: the dropped jobs' requests queue in every shard, as
    # they do in the default 128 shards under a larger load.
    engine = OpenAIEngine([upstream.url], max_connections=16)
    with serve_engine(engine, max_concurrent_jobs=256) as live:
        asyncio.run(_drop_jobs(live.url, STREAMS))
        upstream.state.slow_rate = 0.0  # the plain requests are answered at once
        took = asyncio.run(_plain(live.url))
        print(f"\nplain requests after {STREAMS} dropped streams: max {max(took):.2f} s")
        assert max(took) < PLAIN_TIMEOUT_S
        wait_until(lambda: _in_flight(live) == 0, 10, "no samples in flight")
