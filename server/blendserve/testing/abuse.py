"""Hostile traffic shared by the abuse tests and ``python -m bench.load.abuse``.

Dropped jobs (streams read one event in, non-streamed jobs whose clients give
up), plain ``/v1`` requests after them, and a flood of requests each naming a
model and a budget of its own.
"""

from __future__ import annotations

import asyncio
import random
from collections import Counter
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from blendserve.engines.replay import ReplayEngine

__all__ = [
    "CHAT",
    "FLOOD_MARK",
    "FLOOD_RECORDS",
    "Unlisted",
    "drop_jobs",
    "flood",
    "gauge",
    "plain_requests",
    "series",
]

#: A plain chat request of the fake upstream's model.
CHAT = {"model": "fake-model", "messages": [{"role": "user", "content": "7 or 8?"}]}
#: What the flood's questions are answered with.
FLOOD_RECORDS = [{"prompt": "Seven?", "answers": ["7"]}]
#: Marks every model name the flood mints.
FLOOD_MARK = "client-minted"


def _job(tag: str, stream: bool, questions: int) -> dict[str, object]:
    asked = [
        {"id": f"{tag}-{i}", "messages": [{"role": "user", "content": f"{tag} question {i}?"}]}
        for i in range(questions)
    ]
    return {"questions": asked, "budget": 16 * questions, "stream": stream}


async def _drop_stream(
    client: httpx.AsyncClient, url: str, body: dict[str, object], linger: float
) -> None:
    """Reads the job's first event, lingers ``linger`` s, then closes the connection."""
    async with client.stream("POST", f"{url}/solve", json=body) as response:
        if response.status_code != 200:
            raise AssertionError(await response.aread())
        async for line in response.aiter_lines():
            if not line:  # the end of the first event
                break
        # The moment of leaving is spread over the job's first half second on purpose.
        await asyncio.sleep(linger)


async def _give_up(
    client: httpx.AsyncClient, url: str, body: dict[str, object], after: float
) -> None:
    """Posts a non-streamed job and gives up after ``after`` s."""
    try:
        await client.post(f"{url}/solve", json=body, timeout=after)
    except httpx.TimeoutException:
        return
    raise AssertionError("a job meant to outlast its client answered")


async def drop_jobs(
    url: str, streams: int, *, at_once: int = 50, timed_out: int = 5, questions: int = 20
) -> None:
    """Drops ``streams`` streamed jobs ``at_once`` at a time, and ``timed_out`` more a round."""
    rng = random.Random(1093)
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=0)
    async with httpx.AsyncClient(limits=limits, timeout=30) as client:
        for start in range(0, streams, at_once):
            count = min(at_once, streams - start)
            await asyncio.gather(
                *(
                    _drop_stream(
                        client, url, _job(f"s{start + i}", True, questions), rng.uniform(0, 0.5)
                    )
                    for i in range(count)
                ),
                *(
                    _give_up(
                        client, url, _job(f"t{start + i}", False, questions), rng.uniform(0.1, 0.5)
                    )
                    for i in range(timed_out)
                ),
            )


async def plain_requests(
    url: str, count: int, *, at_once: int = 10, timeout: float = 2.0
) -> tuple[list[float], list[BaseException]]:
    """Sends ``count`` plain chat requests, ``at_once`` at a time: their seconds, and failures."""
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=0)
    async with httpx.AsyncClient(limits=limits, timeout=timeout) as client:

        async def one() -> float:
            start = asyncio.get_running_loop().time()
            response = await client.post(f"{url}/v1/chat/completions", json=CHAT)
            if response.status_code != 200:
                raise AssertionError(response.text)
            return asyncio.get_running_loop().time() - start

        results: list[float | BaseException] = []
        for _ in range(0, count, at_once):
            results += await asyncio.gather(
                *(one() for _ in range(at_once)), return_exceptions=True
            )
    took = [r for r in results if isinstance(r, float)]
    return took, [r for r in results if isinstance(r, BaseException)]


def gauge(url: str, name: str) -> float:
    """The value of an unlabelled metric of the server at ``url``."""
    text = httpx.get(f"{url}/metrics", timeout=60).text
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name:
                return sample.value
    raise AssertionError(f"no {name}")


class Unlisted(ReplayEngine):
    """A replay engine that lists no model: any name a request gives goes on as it is."""

    async def models(self) -> list[str]:
        """None."""
        return []


def _flood_body(i: int, n: int) -> dict[str, Any]:
    """A request of its own model name (512 characters) and its own budget, in [1, 16)."""
    return {
        "model": f"{FLOOD_MARK}-{i}-".ljust(512, "x"),
        "prompt": "Seven?",
        "max_tokens": 8,
        "blendserve": {"budget_per_question": 1 + 15 * i / n, "answer": "exact"},
    }


async def flood(url: str, n: int, concurrency: int = 16) -> Counter[int]:
    """Sends ``n`` requests of distinct models and budgets, ``concurrency`` at a time; statuses."""
    statuses: Counter[int] = Counter()
    next_request = iter(range(n))
    limits = httpx.Limits(max_connections=concurrency)
    async with httpx.AsyncClient(base_url=url, timeout=60, limits=limits) as client:

        async def worker() -> None:
            for i in next_request:
                reply = await client.post("/v1/completions", json=_flood_body(i, n))
                statuses[reply.status_code] += 1

        await asyncio.gather(*(worker() for _ in range(concurrency)))
    return statuses


def series(text: str) -> list[str]:
    """The sample lines of an exposition (no comments)."""
    return [line for line in text.splitlines() if line and not line.startswith("#")]
