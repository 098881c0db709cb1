"""The phases of ``python -m bench.load.abuse`` for abused engines, each against a
``blendserve serve``.

Each starts the real command (``bench/load/abuse/server.py``) on loopback and
reproduces a fix of the engines issue:

* ``metrics``: a fake upstream (:mod:`blendserve.testing.fake_openai`, no model)
  whose ``/metrics`` carries vLLM's running gauge in 100,000 label sets (3.7
  MiB, under the 4 MiB cap), behind ``--engine-capacity 32``, whose load is
  read every half second: 4-question ``/solve`` jobs each under 1 s and
  ``/health`` meanwhile at p99 under 0.5 s (it was parsed on the event loop:
  stalls of 2-4 s, such a ``/solve`` 6-7 s).
* ``replay``: the replay engine at ``--replay-capacity 3``: ``/solve`` jobs of
  one question, ``max_rounds`` 1 and a budget of 1,000, finished or left by
  their client, each followed by a budget-1 ``/solve``, which must complete
  (a waiter cancelled as slots freed lost them: every later request hung).
"""

from __future__ import annotations

import json
import math
import statistics
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
from blendserve.testing.abuse import gauge
from blendserve.testing.accounting import settle_accounting
from blendserve.testing.fake_openai import FakeServer, FakeState

from bench.load.abuse.server import serve

__all__ = ["PHASES"]

MESSAGES = [{"role": "user", "content": "What is 6 * 7?"}]


def _solve(questions: int, budget: int, **options: Any) -> dict[str, Any]:
    asked = [{"id": f"q{i}", "messages": MESSAGES} for i in range(questions)]
    return {"questions": asked, "budget": budget, "answer": {"kind": "number"}, **options}


def _post(
    url: str, body: dict[str, Any], timeout: float, client: httpx.Client | None = None
) -> tuple[str, float]:
    """What became of one ``/solve`` (its status, an HTTP status, or the error) and its seconds."""
    started = time.monotonic()
    try:
        if client is None:
            reply = httpx.post(f"{url}/solve", json=body, timeout=timeout)
        else:
            reply = client.post(f"{url}/solve", json=body, timeout=timeout)
        status = str(reply.json()["status"] if reply.status_code == 200 else reply.status_code)
    except httpx.HTTPError as exc:
        status = type(exc).__name__
    return status, time.monotonic() - started


def _p(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, math.ceil(q * len(ordered)) - 1)]


def _ms(seconds: list[float]) -> str:
    return (
        f"p50 {statistics.median(seconds) * 1000:.0f} ms, p99 {_p(seconds, 0.99) * 1000:.0f} ms, "
        f"max {max(seconds) * 1000:.0f} ms"
    )


def _probe_health(url: str, stop: threading.Event, seconds: list[float]) -> None:
    while not stop.wait(0.02):
        started = time.monotonic()
        httpx.get(f"{url}/health", timeout=60)
        seconds.append(time.monotonic() - started)


# --- metrics ---------------------------------------------------------------------------


def metrics(label_sets: int = 100_000, jobs: int = 10, quiet_s: float = 3.0) -> bool:
    """An upstream ``/metrics`` of ``label_sets`` label sets: ``/solve`` and ``/health`` times."""
    many = "".join(f'vllm:num_requests_running{{x="{i}"}} 0\n' for i in range(label_sets))
    fake = FakeServer(FakeState(name="labels", answers=("42",), record=False, extra_metrics=many))
    fake.start()
    health: list[float] = []
    try:
        with serve(["--upstreams", fake.url, "--engine-capacity", "32"]) as served:
            stop = threading.Event()
            probe = threading.Thread(target=_probe_health, args=(served.url, stop, health))
            probe.start()
            warm = _post(served.url, _solve(1, 1), 60)  # the load poller starts
            solves = [_post(served.url, _solve(4, 16), 60) for _ in range(jobs)]
            stop.wait(quiet_s)  # /health alone for some load intervals, no synchronisation
            stop.set()
            probe.join()
            read = fake.state.metrics_requests
    finally:
        fake.kill()
    took = [seconds for _, seconds in solves]
    statuses = Counter(status for status, _ in [warm, *solves])
    print(
        f"metrics: an upstream /metrics of {label_sets:,} label sets "
        f"({len(many) / 2**20:.1f} MiB), --engine-capacity 32; read {read} time(s) in "
        f"{warm[1] + sum(took) + quiet_s:.1f} s (none after a reading without vLLM's gauges)\n"
        f"  /solve statuses {dict(statuses)}; {jobs} of 4 questions: {_ms(took)} "
        f"(target under 1 s each)\n"
        f"  /health over {len(health)} probes: {_ms(health)} (target p99 under 500 ms)"
    )
    completed = statuses == Counter({"completed": jobs + 1})
    return completed and max(took) < 1.0 and _p(health, 0.99) < 0.5


# --- replay ----------------------------------------------------------------------------


def replay(
    rounds: int = 20, budget: int = 1000, leave_s: float = 0.005, later_timeout: float = 10.0
) -> bool:
    """Capacity-3 replay: ``max_rounds`` 1 jobs, finished or left, each then a budget-1 job."""
    records = [{"id": f"q{i}", "answers": ["1", "2", "1"]} for i in range(4)]
    lines: list[str] = []
    big_statuses: Counter[str] = Counter()
    later: list[tuple[str, float]] = []
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "answers.jsonl"
        data.write_text("".join(json.dumps(r) + "\n" for r in records))
        flags = ["--engine", "replay", "--data", str(data), "--replay-capacity", "3"]
        with serve(flags) as served, httpx.Client() as client:
            for i in range(rounds):
                left = i % 2 == 1  # every other big job is left by its client after leave_s
                big_job = _solve(1, budget, max_rounds=1)
                big = _post(served.url, big_job, leave_s if left else 60, client)
                after = _post(served.url, _solve(1, 1), later_timeout, client)
                big_statuses[big[0]] += 1
                later.append(after)
                lines.append(
                    f"  {'left' if left else 'finished'}: {big[0]} after {big[1] * 1000:.0f} ms, "
                    f"then budget 1: {after[0]} in {after[1] * 1000:.0f} ms"
                )
            accounting, waited = settle_accounting(served.url, timeout=10.0)
            in_flight = gauge(served.url, "blendserve_in_flight_samples")
    statuses = Counter(status for status, _ in later)
    print(
        f"replay: --replay-capacity 3, {rounds} jobs of max_rounds 1 and budget {budget:,} "
        f"(finished or left), each followed by a budget-1 /solve (timeout {later_timeout:g} s)\n"
        + "\n".join(lines[:4])
        + f"\n  ...\n  big jobs: {dict(big_statuses)}; "
        f"budget-1 jobs: {dict(statuses)}, {_ms([s for _, s in later])}; "
        f"samples in flight at the end {in_flight:g}; accounting "
        f"{'holds' if accounting.holds() else f'does NOT hold after {waited:.1f} s'}: "
        f"{accounting.describe()}"
    )
    return statuses == Counter({"completed": rounds}) and accounting.holds()


#: Phase name -> its run (True: its checks passed).
PHASES: dict[str, Callable[[], bool]] = {"metrics": metrics, "replay": replay}
