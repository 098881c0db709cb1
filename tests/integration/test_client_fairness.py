"""One client's traffic does not move another client's latency or spend within a ``/v1`` pool.

A real uvicorn server on loopback over the replay engine, two API keys, one
online pool (same model, answer format, sampling and budget): a client whose
answers keep the sympy workers busy does not hold back another client's
answer, and a client flooding unanimous questions does not move the stopping
threshold another client's questions are paced by.
"""

import random
import threading
import time
from collections.abc import Sequence
from typing import Any

import httpx
from blendserve.engines.base import Engine
from blendserve.engines.replay import ReplayEngine
from blendserve.service import Settings, create_app
from blendserve.testing.live import LiveServer, serve_engine
from blendserve.testing.waiting import wait_until

SLOW, OTHER = "key-slow", "key-other"
# Each slow answer is a distinct polynomial power: about a second of sympy (within what
# is safe to parse), so the slow client's questions queue several seconds of it.
NUM_SLOW = 8
SLOW_RECORDS = [
    {"prompt": f"slow {k}", "answers": [f"(x+y+z+{k})^{{24}}"]} for k in range(1, NUM_SLOW + 1)
]
# Fresh answers (never cached before) that need sympy, but only milliseconds of it.
ORDINARY_RECORDS = [
    {"prompt": "ordinary alone", "answers": [r"\frac{2}{7}"]},
    {"prompt": "ordinary loaded", "answers": [r"\frac{3}{11}"]},
]
FLOOD, HARD = 400, 30
FLOOD_RECORDS = [{"prompt": f"easy {i}", "answers": ["7"]} for i in range(FLOOD)]
# Contested answers (60/30/10), each question's list in an order of its own: with
# one seed for every request (one pool) its samples are the same whatever else runs.
HARD_RECORDS = [
    {"prompt": f"hard {j}", "answers": random.Random(j).sample(["1"] * 6 + ["2"] * 3 + ["3"], 10)}
    for j in range(HARD)
]


def _ask(
    url: str, key: str, prompts: str | Sequence[str], options: dict[str, Any]
) -> list[dict[str, Any]]:
    """One voted ``/v1/completions`` request; its ``blendserve`` votes, one per prompt."""
    # The sampling parameters, seed included, are the same for every request: one pool.
    body = {
        "model": "replay",
        "prompt": prompts,
        "max_tokens": 64,
        "seed": 7,
        "blendserve": options,
    }
    headers = {"Authorization": f"Bearer {key}"}
    reply = httpx.post(f"{url}/v1/completions", json=body, headers=headers, timeout=120)
    assert reply.status_code == 200, reply.text
    votes: list[dict[str, Any]] = reply.json()["blendserve"]
    return votes


def _timed(url: str, key: str, prompt: str) -> float:
    started = time.monotonic()
    (vote,) = _ask(url, key, prompt, {"answer": "math"})
    assert vote["answer"] is not None
    return time.monotonic() - started


def _serve_with_own_workers(engine: ReplayEngine) -> LiveServer:
    """The service over ``engine`` with sympy workers of its own, as many as by default."""

    async def factory() -> Engine:
        return engine

    config = Settings(api_keys=(SLOW, OTHER), group_wait_ms=0)
    return LiveServer(
        create_app(config, engine_factory=factory), connections=config.connection_timeouts()
    )


def test_a_client_with_slow_answers_does_not_delay_another_clients_answer() -> None:
    with _serve_with_own_workers(ReplayEngine(SLOW_RECORDS + ORDINARY_RECORDS, seed=1)) as live:
        keys = live.service.job_maker.keys
        keys.warm_up()  # the workers are up: the alone latency has no start-up in it
        alone = _timed(live.url, OTHER, "ordinary alone")
        before = keys.cache_info()
        slow_done: list[float] = []

        def slow(prompt: str) -> None:
            _ask(live.url, SLOW, prompt, {"answer": "math"})
            slow_done.append(time.monotonic())

        threads = [threading.Thread(target=slow, args=(r["prompt"],)) for r in SLOW_RECORDS]
        for thread in threads:
            thread.start()
        try:
            # Every slow answer has asked for its key; at most one is parsed yet.
            wait_until(
                lambda: keys.cache_info().misses - before.misses >= NUM_SLOW,
                30,
                "the slow answers queued for sympy",
            )
            queued = NUM_SLOW - (keys.cache_info().size - before.size)
            loaded = _timed(live.url, OTHER, "ordinary loaded")
            behind = NUM_SLOW - len(slow_done)
        finally:
            for thread in threads:
                thread.join(120)
    # First come, first served, the other client's answer waited for all of them.
    assert queued >= NUM_SLOW - 2, queued
    assert loaded - alone < 1.0, (alone, loaded, queued, behind)
    assert behind >= NUM_SLOW // 2, (queued, behind)


def _hard_samples(url: str, key: str) -> float:
    """Mean samples per question of the hard questions, asked one at a time."""
    options = {"answer": "number", "budget_per_question": 8}
    spent = [
        vote["samples"]
        for record in HARD_RECORDS
        for vote in _ask(url, key, record["prompt"], options)
    ]
    return sum(spent) / len(spent)


def test_a_client_flooding_unanimous_questions_does_not_move_another_clients_spend() -> None:
    records = FLOOD_RECORDS + HARD_RECORDS
    with serve_engine(ReplayEngine(records, seed=1), api_keys=(SLOW, OTHER)) as live:
        alone = _hard_samples(live.url, OTHER)
    with serve_engine(ReplayEngine(records, seed=1), api_keys=(SLOW, OTHER)) as live:
        options = {"answer": "number", "budget_per_question": 8}
        prompts = [r["prompt"] for r in FLOOD_RECORDS]
        for start in range(0, FLOOD, 50):
            for vote in _ask(live.url, SLOW, prompts[start : start + 50], options):
                assert vote["answer"] == "7"
        flooded = _hard_samples(live.url, OTHER)
    # The hard client's spend is its own: as alone, near its budget.
    assert abs(flooded - alone) <= 0.15 * alone, (alone, flooded)
    assert flooded <= 1.5 * 8, (alone, flooded)
