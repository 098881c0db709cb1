"""The ``clients`` phase of ``python -m bench.load.abuse``: many ``/v1`` client ids in one pool.

``clients``: a real ``blendserve serve`` over the replay engine, clients named
by ``--client-header`` (a header anyone sets on an open service). The same
traffic, 40 threads sending questions contested to a degree of their own, is
sent twice to a fresh server: once as one client id, once as 40 (each then
fits a prior of its own, so each needs a wave programme of its own, hundreds
of milliseconds to build). ``/health`` is probed throughout; the phase holds
when its p99 beside 40 client ids stays within 1.5x of its p99 beside one.
"""

from __future__ import annotations

import json
import random
import statistics
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx

from bench.load.abuse.server import rss_kib, serve

__all__ = ["PHASES"]

HEADER = "x-client-id"
CLIENTS = 40
# Questions per thread (two refits of a prior: one every 50), asked this many at a time.
QUESTIONS, BATCH = 110, 10
# A probe of /health every this many seconds.
PROBE_S = 0.05


def _records() -> list[dict[str, Any]]:
    """Each thread's questions: contested to a degree of its own (20 recorded answers)."""
    records = []
    for c in range(CLIENTS):
        rng = random.Random(c)
        for q in range(QUESTIONS):
            leader = rng.randint(10 + c % 8, 20)
            answers = ["1"] * leader + ["2"] * (20 - leader)
            rng.shuffle(answers)
            records.append({"prompt": f"client {c} question {q}", "answers": answers})
    return records


def _asks(url: str, thread: int, client: str) -> list[int]:
    """Thread ``thread``'s questions as ``client``'s, ``BATCH`` a request; the statuses."""
    statuses = []
    with httpx.Client(timeout=600) as http:
        for start in range(0, QUESTIONS, BATCH):
            prompts = [f"client {thread} question {q}" for q in range(start, start + BATCH)]
            body = {
                "model": "replay",
                "prompt": prompts,
                "max_tokens": 16,
                "seed": 7,
                "blendserve": {"answer": "number", "budget_per_question": 8},
            }
            reply = http.post(f"{url}/v1/completions", json=body, headers={HEADER: client})
            statuses.append(reply.status_code)
    return statuses


def _probe(url: str, stop: threading.Event, seconds: list[float]) -> None:
    with httpx.Client(timeout=30) as http:
        while not stop.wait(PROBE_S):
            started = time.monotonic()
            http.get(f"{url}/health")
            seconds.append(time.monotonic() - started)


def _p(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def _run(data: Path, client: Callable[[int], str]) -> tuple[list[float], list[int], float, int]:
    """The traffic against a fresh server, thread ``i`` as ``client(i)``: ``/health``'s
    latencies, the statuses, the seconds it took and the server's memory growth (KiB)."""
    flags = [
        "--engine", "replay", "--data", str(data),
        "--client-header", HEADER, "--default-concurrency", "64",
    ]  # fmt: skip
    health: list[float] = []
    with serve(flags) as served:
        idle = rss_kib(served.pid)
        stop = threading.Event()
        probe = threading.Thread(target=_probe, args=(served.url, stop, health))
        probe.start()
        started = time.monotonic()
        with ThreadPoolExecutor(CLIENTS) as pool:
            done = pool.map(lambda i: _asks(served.url, i, client(i)), range(CLIENTS))
            statuses = [status for asked in done for status in asked]
        took = time.monotonic() - started
        stop.set()
        probe.join()
        grown = rss_kib(served.pid) - idle
    return health, statuses, took, grown


def _ms(seconds: list[float]) -> str:
    return (
        f"p50 {statistics.median(seconds) * 1000:.0f} ms, p99 {_p(seconds, 0.99) * 1000:.0f} ms, "
        f"max {max(seconds) * 1000:.0f} ms"
    )


def clients(bound: float = 1.5) -> bool:
    """40 interleaving client ids against one: ``/health``'s p99 within ``bound`` times."""
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "clients.jsonl"
        data.write_text("".join(json.dumps(r) + "\n" for r in _records()))
        alone, alone_statuses, alone_s, alone_kib = _run(data, lambda _: "one")
        many, many_statuses, many_s, many_kib = _run(data, lambda i: f"client-{i}")
    questions = CLIENTS * QUESTIONS
    ok = set(alone_statuses) == set(many_statuses) == {200}
    holds = _p(many, 0.99) <= bound * _p(alone, 0.99)
    print(
        f"clients: {questions} /v1 questions from {CLIENTS} threads, {BATCH} a request\n"
        f"  as one client id: {alone_s:.1f} s, server memory {alone_kib / 1024:+.0f} MiB, "
        f"/health over {len(alone)} probes {_ms(alone)}\n"
        f"  as {CLIENTS} client ids: {many_s:.1f} s, server memory {many_kib / 1024:+.0f} MiB, "
        f"/health over {len(many)} probes {_ms(many)}\n"
        f"  p99 {_p(many, 0.99) / _p(alone, 0.99):.2f}x of one client id's (at most {bound:g}x); "
        f"statuses {sorted(set(alone_statuses + many_statuses))}"
    )
    return ok and holds


PHASES: dict[str, Callable[[], bool]] = {"clients": clients}
