"""A replica's Retry-After honoured once per streak, and seeds shifted within 64 bits."""

from __future__ import annotations

import asyncio
import json

import httpx2 as httpx
import pytest
from blendserve.engines._retry import Throttles
from blendserve.engines.base import (
    SEED_MAX,
    SEED_MIN,
    GenerateRequest,
    SamplingParams,
    shift_seed,
)
from blendserve.engines.config import RetryPolicy
from blendserve.engines.openai import OpenAIEngine

URL = "http://up.test/v1"
CHAT = [{"role": "user", "content": "2+2?"}]


def test_a_replicas_first_retry_after_is_honoured_then_the_backoff() -> None:
    throttles = Throttles()
    assert throttles.honour(URL, None, 0.0) is None  # none given: the backoff
    assert throttles.honour(URL, 2.0, 10.0) == 2.0
    assert throttles.honour(URL, 2.0, 11.5) == 0.5  # in flight meanwhile: the same moment
    assert throttles.honour(URL, 2.0, 12.0) is None  # still throttling after it: the backoff
    assert throttles.honour("http://other/v1", 2.0, 12.0) == 2.0  # per replica
    throttles.answered(URL)
    assert throttles.honour(URL, 3.0, 20.0) == 3.0  # a new streak


def _throttling(times: int, retry_after: str) -> tuple[list[dict[str, object]], OpenAIEngine]:
    bodies: list[dict[str, object]] = []

    async def handler(request: httpx.Request) -> httpx.Response:
        bodies.append(json.loads(request.content))
        if len(bodies) <= times:
            return httpx.Response(429, headers={"Retry-After": retry_after})
        message = {"role": "assistant", "content": "4"}
        choice = {"index": 0, "message": message, "finish_reason": "stop"}
        return httpx.Response(200, json={"choices": [choice], "usage": {}})

    transport = httpx.MockTransport(handler)
    return bodies, OpenAIEngine([URL], transport=transport, retry=RetryPolicy(backoff_base=0.001))


def test_a_request_waits_out_one_retry_after_and_backs_off_after_it() -> None:
    bodies, engine = _throttling(3, "0.5")
    waits: list[float | None] = []
    honour = engine._throttles.honour

    def recorded(url: str, retry_after: float | None, now: float) -> float | None:
        waits.append(honour(url, retry_after, now))
        return waits[-1]

    engine._throttles.honour = recorded  # type: ignore[method-assign]

    async def main() -> None:
        async with engine:
            assert len(await engine.generate(GenerateRequest(messages=CHAT))) == 1

    asyncio.run(main())
    assert len(bodies) == 4
    assert waits == [0.5, None, None]  # Retry-After once, then the backoff


@pytest.mark.parametrize(
    ("seed", "by", "shifted"),
    [
        (0, 5, 5),
        (SEED_MAX, 0, SEED_MAX),
        (SEED_MAX, 1, SEED_MIN),
        (SEED_MAX, 3, SEED_MIN + 2),
        (SEED_MIN, 0, SEED_MIN),
        (SEED_MIN, 1, SEED_MIN + 1),
        (-1, 2**64, -1),
    ],
)
def test_a_shifted_seed_wraps_within_64_bits(seed: int, by: int, shifted: int) -> None:
    assert shift_seed(seed, by) == shifted
    assert SamplingParams(seed=seed).from_sample(by).seed == shifted


def test_single_requests_carry_shifted_seeds_that_wrap() -> None:
    seeds: list[object] = []

    async def handler(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        seeds.append(body.get("seed"))
        message = {"role": "assistant", "content": "4"}
        choice = {"index": 0, "message": message, "finish_reason": "stop"}
        return httpx.Response(200, json={"choices": [choice], "usage": {}})

    async def main() -> None:
        transport = httpx.MockTransport(handler)
        async with OpenAIEngine([URL], transport=transport, n_support="no") as engine:
            params = SamplingParams(seed=SEED_MAX - 1)
            await engine.generate(GenerateRequest(messages=CHAT, n=4, params=params))

    asyncio.run(main())
    assert sorted(seeds) == sorted([SEED_MAX - 1, SEED_MAX, SEED_MIN, SEED_MIN + 1])  # type: ignore[type-var]
