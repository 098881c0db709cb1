"""The engine's connection pool: its turns when full, and the connections it drops."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from types import SimpleNamespace

import httpcore2
import httpx2
import pytest
from blendserve.engines.base import GenerateRequest
from blendserve.engines.config import Health, Limits, RetryPolicy, Timeouts
from blendserve.engines.openai import OpenAIEngine, _http_pool
from blendserve.engines.openai._http_pool import HttpPool, _Connection
from blendserve.errors import EngineUnavailable
from blendserve.testing.accounting import assert_accounting
from blendserve.testing.fake_openai import FakeServer
from blendserve.testing.stats import RecordingStats

BASE = "http://up.test/v1"
ORIGIN = httpcore2.Origin(b"http", b"up.test", 80)
OK = {
    "choices": [{"index": 0, "message": {"content": "4"}, "finish_reason": "stop"}],
    "usage": {"prompt_tokens": 3, "completion_tokens": 1},
}


def _pool(handler: Callable[[httpx2.Request], Awaitable[httpx2.Response]], size: int) -> HttpPool:
    transport = httpx2.MockTransport(handler)
    return HttpPool([BASE], size, api_key=None, connect_timeout=1.0, transport=transport)


class _Gate:
    """A handler that holds every request until opened and counts those it holds."""

    def __init__(self) -> None:
        self.open = asyncio.Event()
        self.held = self.most = 0
        self.order: list[bytes] = []

    async def __call__(self, request: httpx2.Request) -> httpx2.Response:
        self.order.append(request.content)
        self.held += 1
        self.most = max(self.most, self.held)
        try:
            await self.open.wait()
        finally:
            self.held -= 1
        return httpx2.Response(200, json=OK)


def test_requests_over_the_limit_wait_their_turn_in_order() -> None:
    async def main() -> None:
        gate = _Gate()
        pool = _pool(gate, 2)
        # Tasks start in the order they were made: each one asks for its turn in that order.
        posts = [
            asyncio.ensure_future(pool.post(BASE, "/chat/completions", b"%d" % i)) for i in range(8)
        ]
        await asyncio.wait_for(_until(lambda: gate.held == 2), 5)
        gate.open.set()
        responses = await asyncio.wait_for(asyncio.gather(*posts), 5)
        assert [r.status_code for r in responses] == [200] * 8
        assert gate.most == 2
        assert gate.order == [b"%d" % i for i in range(8)]

    asyncio.run(main())


def test_a_request_that_stops_waiting_takes_no_connection() -> None:
    async def main() -> None:
        gate = _Gate()
        pool = _pool(gate, 1)
        first = asyncio.ensure_future(pool.post(BASE, "/chat/completions", b"first"))
        await asyncio.wait_for(_until(lambda: gate.held == 1), 5)
        waiting = asyncio.ensure_future(pool.post(BASE, "/chat/completions", b"gone"))
        await asyncio.wait_for(_until(lambda: pool._waiting[BASE]), 5)
        waiting.cancel()
        gate.open.set()
        await asyncio.wait_for(first, 5)
        after = await asyncio.wait_for(pool.post(BASE, "/chat/completions", b"after"), 5)
        assert after.status_code == 200 and gate.order == [b"first", b"after"]

    asyncio.run(main())


def test_a_side_request_waits_its_timeout_at_most() -> None:
    async def main() -> None:
        gate = _Gate()
        pool = _pool(gate, 1)
        held = asyncio.ensure_future(pool.post(BASE, "/chat/completions", b"held"))
        await asyncio.wait_for(_until(lambda: gate.held == 1), 5)
        with pytest.raises(httpx2.PoolTimeout):
            await pool.get(BASE, "/models", 0.05)
        gate.open.set()
        await asyncio.wait_for(held, 5)

    asyncio.run(main())


def test_pool_timeouts_are_retried_and_leave_the_breaker_closed() -> None:
    calls = 0

    async def handler(request: httpx2.Request) -> httpx2.Response:
        nonlocal calls
        calls += 1
        if calls <= 3:
            raise httpx2.PoolTimeout("no connection", request=request)
        return httpx2.Response(200, json=OK)

    async def main() -> None:
        transport = httpx2.MockTransport(handler)
        async with OpenAIEngine(
            [BASE],
            transport=transport,
            health=Health(failure_threshold=2),
            retry=RetryPolicy(backoff_base=0.001),
        ) as engine:
            ask = GenerateRequest(messages=[{"role": "user", "content": "2+2?"}])
            samples = await engine.generate(ask)
            assert [s.text for s in samples] == ["4"] and calls == 4
            assert (await engine.health()).upstreams == {BASE: True}

    asyncio.run(main())


class _Inner(httpcore2.AsyncConnectionInterface):
    """An HTTP/1.1 connection's states, without a socket; ``fail`` ends requests with it."""

    def __init__(self, fail: BaseException | None = None, closes_to: str = "IDLE") -> None:
        self.state = "NEW"
        self.fail = fail
        self.closes_to = closes_to

    async def handle_async_request(self, request: httpcore2.Request) -> httpcore2.Response:
        if self.fail is not None:
            raise self.fail
        self.state = "ACTIVE"
        return httpcore2.Response(200, content=_Stream(self))

    async def aclose(self) -> None:
        self.state = "CLOSED"

    def info(self) -> str:
        return self.state

    def can_handle_request(self, origin: httpcore2.Origin) -> bool:
        return origin == ORIGIN

    def is_connected(self) -> bool:
        return self.state != "CLOSED"

    def is_available(self) -> bool:
        return self.state == "IDLE"

    def has_expired(self) -> bool:
        return False

    def is_idle(self) -> bool:
        return self.state == "IDLE"

    def can_multiplex(self) -> bool:
        return False

    def is_closed(self) -> bool:
        return self.state == "CLOSED"


class _Stream:
    """A body whose close leaves its connection in ``closes_to``."""

    def __init__(self, connection: _Inner) -> None:
        self.connection = connection

    async def __aiter__(self) -> AsyncIterator[bytes]:
        yield b"{}"

    async def aclose(self) -> None:
        self.connection.state = self.connection.closes_to


def _request() -> httpcore2.Request:
    return httpcore2.Request("POST", "http://up.test/v1/completions")


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """The pool's clock, in seconds, moved by the test."""
    now = [0.0]
    monkeypatch.setattr(_http_pool, "time", SimpleNamespace(monotonic=lambda: now[0]))
    return now


def test_a_connection_no_request_started_on_gives_up(clock: list[float]) -> None:
    connection = _Connection(_Inner(), give_up_s=10)
    clock[0] = 10
    assert not connection.is_closed()
    clock[0] = 10.5
    assert connection.is_closed() and not connection.is_available()
    with pytest.raises(httpcore2.ConnectionNotAvailable):
        asyncio.run(connection.handle_async_request(_request()))


def test_a_started_connection_never_gives_up(clock: list[float]) -> None:
    async def main() -> None:
        connection = _Connection(_Inner(), give_up_s=10)
        response = await connection.handle_async_request(_request())
        clock[0] = 60
        assert not connection.is_closed()
        await response.aclose()
        assert connection.is_idle() and not connection.is_closed()

    asyncio.run(main())


@pytest.mark.parametrize("fail", [asyncio.CancelledError(), httpcore2.ReadError("reset")])
def test_a_failed_request_that_strands_its_connection_closes_it(fail: BaseException) -> None:
    inner = _Inner(fail=fail)  # left NEW: connected, no request on it
    connection = _Connection(inner, give_up_s=60)
    with pytest.raises(type(fail)):
        asyncio.run(connection.handle_async_request(_request()))
    assert inner.state == "CLOSED" and connection.is_closed()


def test_a_connection_serving_another_request_is_left_alone() -> None:
    inner = _Inner(fail=httpcore2.ConnectionNotAvailable())
    inner.state = "ACTIVE"
    connection = _Connection(inner, give_up_s=60)
    with pytest.raises(httpcore2.ConnectionNotAvailable):
        asyncio.run(connection.handle_async_request(_request()))
    assert inner.state == "ACTIVE" and not connection.is_closed()


def test_a_response_whose_close_strands_its_connection_closes_it() -> None:
    async def main() -> None:
        inner = _Inner(closes_to="ACTIVE")  # a close cut short
        connection = _Connection(inner, give_up_s=60)
        response = await connection.handle_async_request(_request())
        assert b"".join([chunk async for chunk in response.aiter_stream()]) == b"{}"
        await response.aclose()
        assert inner.state == "CLOSED" and connection.is_closed()

    asyncio.run(main())


async def _until(condition: Callable[[], object]) -> None:
    while not condition():
        await asyncio.sleep(0.001)


def test_real_connections_are_the_pool_s_own(fakes: Callable[..., list[FakeServer]]) -> None:
    (upstream,) = fakes(1)

    async def main() -> None:
        pool = HttpPool([upstream.url], 2, api_key=None, connect_timeout=1.0, transport=None)
        try:
            response = await pool.get(upstream.url, "/models", 5.0)
            assert response.status_code == 200
            (transport,) = pool._shards[upstream.url]
            held = transport._pool.connections
            assert held and all(isinstance(c, _Connection) for c in held)
        finally:
            await pool.aclose()

    asyncio.run(main())


def test_a_request_cancelled_as_its_turn_comes_is_cancelled_and_passes_its_turn_on() -> None:
    """asyncio.wait_for (Python 3.11) returned the shard handed over in the moment its
    caller was cancelled: the cancellation was lost and the request went out anyway."""

    async def main() -> None:
        seen: list[str] = []

        async def handler(request: httpx2.Request) -> httpx2.Response:
            seen.append(request.url.path)
            return httpx2.Response(200, json=OK)

        pool = _pool(handler, 1)
        response, shard = await pool.open(BASE, "/chat/completions", b"{}", 5.0)
        await response.aclose()
        waiting = asyncio.ensure_future(pool.get(BASE, "/models", 5.0))
        await asyncio.wait_for(_until(lambda: pool._waiting[BASE]), 5)
        pool.done(BASE, shard)  # the turn comes ...
        waiting.cancel()  # ... in the same moment as the cancellation
        with pytest.raises(asyncio.CancelledError):
            await waiting
        assert seen == ["/v1/chat/completions"]  # the cancelled request never went out
        assert pool._busy[BASE] == [0] and not pool._waiting[BASE]  # the shard given back
        after = await asyncio.wait_for(pool.get(BASE, "/models", 1.0), 5)
        assert after.status_code == 200

    asyncio.run(main())


def test_samples_no_connection_took_are_not_counted_dispatched(
    fakes: Callable[..., list[FakeServer]],
) -> None:
    """A pool timeout booked samples dispatched (then failed) that never reached the
    upstream: the upstream saw none of them."""
    (upstream,) = fakes(1, latency=30.0)
    stats = RecordingStats()

    async def main() -> None:
        async with OpenAIEngine(
            [upstream.url],
            limits=Limits(connections=1),
            timeouts=Timeouts(connect=0.2),
            retry=RetryPolicy(max_retries=1, backoff_base=0.001),
        ) as engine:
            engine.report_to(stats)
            (transport,) = engine._pool._shards[upstream.url]
            # A request that holds the one connection, where the pool's own count misses it.
            body = b'{"prompt": "held"}'
            request = httpx2.Request("POST", upstream.url + "/completions", content=body)
            holder = asyncio.ensure_future(transport.handle_async_request(request))
            await asyncio.wait_for(_until(lambda: upstream.state.requests == 1), 5)
            with pytest.raises(EngineUnavailable, match="PoolTimeout"):
                await engine.generate(GenerateRequest(prompt="x"))
            holder.cancel()
            await asyncio.wait([holder])

    asyncio.run(main())
    assert upstream.state.requests == 1  # the held one only
    assert stats.samples(upstream.url)["dispatched"] == 0
    assert stats.of("upstream_health")[-1] == (upstream.url, 1.0)  # not the replica's failure
    assert_accounting(stats)
