"""Clients that drop their jobs mid-flight leave the upstream connection pool usable.

The real service on loopback over the OpenAI engine, in front of a fake upstream
(:mod:`blendserve.testing.fake_openai`, a real HTTP server that runs no model) where half
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
from collections.abc import Iterator

import pytest
from blendserve.engines.config import Limits
from blendserve.engines.openai import OpenAIEngine
from blendserve.testing.abuse import drop_jobs, plain_requests
from blendserve.testing.accounting import assert_accounting
from blendserve.testing.fake_openai import FakeServer, FakeState
from blendserve.testing.live import serve_engine

pytestmark = pytest.mark.slow

#: Dropped streamed jobs in all (the issue's figure is 200: BLENDSERVE_DROPPED_STREAMS=200).
STREAMS = int(os.environ.get("BLENDSERVE_DROPPED_STREAMS", "200"))
PLAIN = 50
PLAIN_TIMEOUT_S = 2.0
ANSWERS = ("7", "8")


@pytest.fixture
def upstream() -> Iterator[FakeServer]:
    state = FakeState(name="split", answers=ANSWERS, slow_rate=0.5, slow_latency=3.0, record=False)
    server = FakeServer(state).start()
    try:
        yield server
    finally:
        server.kill()


def test_dropped_jobs_leave_the_upstream_pool_usable(upstream: FakeServer) -> None:
    # 8 shards of 2 connections: the dropped jobs' requests queue in every shard, as
    # they do in the default 128 shards under a larger load.
    engine = OpenAIEngine([upstream.url], limits=Limits(connections=16))
    with serve_engine(engine, max_concurrent_jobs=256) as live:
        asyncio.run(drop_jobs(live.url, STREAMS))
        upstream.state.slow_rate = 0.0  # the plain requests are answered at once
        took, hung = asyncio.run(plain_requests(live.url, PLAIN, timeout=PLAIN_TIMEOUT_S))
        assert not hung, f"{len(hung)} of {PLAIN} plain requests failed, the first: {hung[0]!r}"
        print(f"\nplain requests after {STREAMS} dropped streams: max {max(took):.2f} s")
        assert max(took) < PLAIN_TIMEOUT_S
        # No samples in flight, each dispatched one completed, failed or cancelled.
        accounting = assert_accounting(live.url, engine.urls)
        assert accounting.total("cancelled") > 0  # the dropped jobs' requests
