"""The phases of ``python -m bench.load.abuse`` that start servers of their own (in this process).

Each reproduces a fix the integration tests check, and measures it:

* ``dropped``: 200 streamed ``/solve`` jobs dropped one event in (and timed-out
  non-streamed ones) against a fake upstream answering half its requests after
  3 s; then 50 plain ``/v1`` requests, each to answer within 2 s.
* ``labels``: requests each naming a 512-character model and a budget of its
  own; the ``/metrics`` series, its size and a scrape's time (under 1 MB).
* ``sympy``: in one ``/v1`` pool, one API key's 30 answers of about 1.8 s of
  sympy each, and another key's ordinary request (delayed by under 1 s).
* ``tokenizer``: 600 ``/tokenize`` calls at once (429s beyond the job limit) and
  an 18.9 MB ``/detokenize`` body (413), ``/v1`` and ``/health`` meanwhile.

:data:`PHASES` also holds the upstream fault phases of ``bench/load/abuse/faults.py``,
the many-clients phase of ``bench/load/abuse/clients.py``, the hostile-input phases
of ``bench/load/abuse/inputs.py`` and the abused-engine phases of
``bench/load/abuse/engines.py``.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import threading
import time
from collections.abc import Callable

import httpx
from blendserve.engines.base import Engine
from blendserve.engines.config import Limits
from blendserve.engines.openai import OpenAIEngine
from blendserve.engines.replay import ReplayEngine
from blendserve.service import Settings, create_app
from blendserve.testing.abuse import (
    CHAT,
    FLOOD_RECORDS,
    Unlisted,
    drop_jobs,
    flood,
    gauge,
    plain_requests,
    series,
)
from blendserve.testing.fake_openai import FakeServer, FakeState
from blendserve.testing.live import LiveServer, serve_engine

from bench.load.abuse.clients import PHASES as CLIENT_PHASES
from bench.load.abuse.engines import PHASES as ENGINE_PHASES
from bench.load.abuse.faults import FAULT_PHASES
from bench.load.abuse.inputs import PHASES as INPUT_PHASES

__all__ = ["PHASES"]

SLOW_KEY, OTHER_KEY = "key-slow", "key-other"


def _ms(seconds: list[float]) -> str:
    ordered = sorted(seconds)
    return f"p50 {statistics.median(ordered) * 1000:.0f} ms, max {ordered[-1] * 1000:.0f} ms"


def dropped(streams: int = 200, plain: int = 50) -> bool:
    """Dropped jobs, then plain ``/v1`` requests: each within 2 s, nothing left in flight."""
    state = FakeState(
        name="split", answers=("7", "8"), slow_rate=0.5, slow_latency=3.0, record=False
    )
    upstream = FakeServer(state).start()
    try:
        engine = OpenAIEngine([upstream.url], limits=Limits(connections=16))
        with serve_engine(engine, max_concurrent_jobs=256) as live:
            started = time.monotonic()
            asyncio.run(drop_jobs(live.url, streams))
            dropping = time.monotonic() - started
            state.slow_rate = 0.0
            took, failed = asyncio.run(plain_requests(live.url, plain, timeout=10.0))
            deadline = time.monotonic() + 10
            while gauge(live.url, "blendserve_in_flight_samples") and time.monotonic() < deadline:
                time.sleep(0.05)
            left = gauge(live.url, "blendserve_in_flight_samples")
    finally:
        upstream.kill()
    print(
        f"dropped: {streams} streams dropped in {dropping:.1f} s; {plain} plain /v1 requests: "
        f"{len(failed)} failed, {_ms(took) if took else 'none answered'}; in flight after: {left:g}"
    )
    return not failed and max(took) < 2.0 and left == 0


def labels(requests: int = 10_000) -> bool:
    """A flood of client-named models and budgets: ``/metrics`` stays bounded and quick."""
    health: list[float] = []
    with serve_engine(Unlisted(FLOOD_RECORDS), allow_model_aliases=True) as live:
        before = httpx.get(f"{live.url}/metrics", timeout=60).text
        stop = threading.Event()
        probe = threading.Thread(target=_probe_health, args=(live.url, stop, health))
        probe.start()
        started = time.monotonic()
        statuses = asyncio.run(flood(live.url, requests))
        flooding = time.monotonic() - started
        scraped = time.monotonic()
        after = httpx.get(f"{live.url}/metrics", timeout=60).text
        scrape = time.monotonic() - scraped
        stop.set()
        probe.join()
    added = len(series(after)) - len(series(before))
    size = len(after.encode())
    print(
        f"labels: {requests} requests in {flooding:.0f} s, statuses {dict(statuses)}; "
        f"/metrics {len(series(after))} series ({added:+d}), {size / 1000:.0f} kB, "
        f"scraped in {scrape * 1000:.0f} ms; /health meanwhile {_ms(health)}"
    )
    return statuses == {200: requests} and size < 1_000_000


def _probe_health(url: str, stop: threading.Event, seconds: list[float]) -> None:
    while not stop.wait(0.25):
        started = time.monotonic()
        httpx.get(f"{url}/health", timeout=30)
        seconds.append(time.monotonic() - started)


def _ask(url: str, key: str, prompt: str) -> float:
    """Seconds one voted ``/v1`` request of ``key`` takes (one pool: the same sampling)."""
    body = {
        "model": "replay",
        "prompt": prompt,
        "max_tokens": 64,
        "seed": 7,
        "blendserve": {"answer": "math"},
    }
    started = time.monotonic()
    reply = httpx.post(
        f"{url}/v1/completions", json=body, headers={"Authorization": f"Bearer {key}"}, timeout=600
    )
    if reply.status_code != 200:
        raise SystemExit(f"sympy: {reply.status_code} {reply.text}")
    return time.monotonic() - started


def sympy(slow: int = 30) -> bool:
    """One key's slow math answers do not hold back another key's answer in the same pool."""
    records = [{"prompt": f"slow {k}", "answers": [f"(x+y+z+{k})^{{24}}"]} for k in range(slow)]
    records += [
        {"prompt": f"ordinary {i}", "answers": [f"\\frac{{{i + 2}}}{{{2 * i + 7}}}"]}
        for i in range(10)
    ]
    engine = ReplayEngine(records, seed=1)

    async def factory() -> Engine:
        return engine

    # The service's own sympy workers, as many as it starts by default.
    config = Settings(api_keys=(SLOW_KEY, OTHER_KEY), group_wait_ms=0)
    server = LiveServer(create_app(config, engine_factory=factory))
    with server as live:
        live.service.job_maker.keys.warm_up()  # type: ignore[union-attr]
        alone = [_ask(live.url, OTHER_KEY, f"ordinary {i}") for i in range(5)]
        threads = [
            threading.Thread(target=_ask, args=(live.url, SLOW_KEY, f"slow {k}"))
            for k in range(slow)
        ]
        for thread in threads:
            thread.start()
        time.sleep(2)  # the slow answers reach sympy (a bench: no assertion hangs on it)
        loaded = [_ask(live.url, OTHER_KEY, f"ordinary {i}") for i in range(5, 10)]
        started = time.monotonic()
        for thread in threads:
            thread.join()
        rest = time.monotonic() - started
    delay = max(loaded) - statistics.median(alone)
    print(
        f"sympy: the other key alone {_ms(alone)}; beside {slow} slow answers {_ms(loaded)} "
        f"(delayed by at most {delay:.2f} s); the slow key's requests ended {rest:.0f} s later"
    )
    return delay < 1.0


def tokenizer(calls: int = 600, body_mb: float = 18.9) -> bool:
    """A tokenizer flood is admitted like jobs (429 beyond), a huge body is a 413 at once."""
    upstream = FakeServer(FakeState(name="up", answers=("7",), tokenizer=True)).start()
    try:
        with serve_engine(OpenAIEngine([upstream.url])) as live:
            statuses, chat = asyncio.run(_tokenize_flood(live.url, calls))
            ids = json.dumps({"tokens": [104] * int(body_mb * 1e6 / 5)}).encode()
            health: list[float] = []
            stop = threading.Event()
            probe = threading.Thread(target=_probe_health, args=(live.url, stop, health))
            probe.start()
            started = time.monotonic()
            refused = httpx.post(
                f"{live.url}/detokenize",
                content=ids,
                headers={"content-type": "application/json"},
                timeout=60,
            )
            took = time.monotonic() - started
            stop.wait(0.5)
            stop.set()
            probe.join()
    finally:
        upstream.kill()
    print(
        f"tokenizer: {calls} /tokenize at once: statuses {dict(sorted(statuses.items()))}; "
        f"/v1 meanwhile {_ms(chat)}; a {len(ids) / 1e6:.1f} MB /detokenize body: "
        f"{refused.status_code} in {took * 1000:.0f} ms, /health meanwhile {_ms(health)}"
    )
    return 429 in statuses and refused.status_code == 413


async def _tokenize_flood(url: str, calls: int) -> tuple[dict[int, int], list[float]]:
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=0)
    async with httpx.AsyncClient(base_url=url, limits=limits, timeout=60) as client:

        async def tokenize(i: int) -> int:
            reply = await client.post("/tokenize", json={"prompt": f"question {i}"})
            return reply.status_code

        async def chat() -> float:
            started = asyncio.get_running_loop().time()
            await client.post("/v1/chat/completions", json=CHAT)
            return asyncio.get_running_loop().time() - started

        flood_task = asyncio.gather(*(tokenize(i) for i in range(calls)))
        chats = [await chat() for _ in range(5)]
        codes = await flood_task
    counted: dict[int, int] = {}
    for code in codes:
        counted[code] = counted.get(code, 0) + 1
    return counted, chats


#: Phase name -> its run (True: its checks passed).
PHASES: dict[str, Callable[[], bool]] = {
    "dropped": dropped,
    "labels": labels,
    "sympy": sympy,
    "tokenizer": tokenizer,
    **FAULT_PHASES,
    **CLIENT_PHASES,
    **INPUT_PHASES,
    **ENGINE_PHASES,
}
