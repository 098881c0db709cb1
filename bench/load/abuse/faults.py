"""The phases of ``python -m bench.load.abuse`` for upstream faults, each against a
``blendserve serve``.

Each starts the real command (``bench/load/abuse/server.py``) on loopback over a
fake upstream started in this process (:mod:`blendserve.testing.fake_openai`: a
real HTTP server that runs no model, for fault injection) or over the replay
engine, reproduces a fix of the hardening issue and measures it:

* ``breaker``: an upstream that ignores ``n`` goes down (connections refused)
  until its breaker is open, three times, and comes back: the first ``/solve``
  and ``/v1`` answers, from its return, within the probe interval plus the
  longest retry backoff (3 s).
* ``keys``: 10 ``/solve`` jobs of 100 math questions each answered
  ``\\boxed{(9x+k)^{1000}}``: each reply under 1 MB, the server's memory,
  ``/health`` meanwhile (p99 under 200 ms).
* ``hung``: an upstream that accepts and never answers, with
  ``--upstream-timeout 3 --job-failure-timeout 2``: ``/solve``, ``/v1``
  (streamed or not) and a passed-through request each end within those plus 1 s.
* ``nested``: an upstream whose bodies, streamed chunks and model list are JSON
  nested 200,000 deep: every reply the error contract with no Python internals
  (a passed-through reply is the upstream's body, relayed as is).
* ``accounting``: those faults and more (errors, dropped connections, clients
  that leave, the upstream killed mid-job) in turn against one server, each
  followed by: per upstream, dispatched = completed + failed + cancelled + in
  flight (:mod:`blendserve.testing.accounting`).

The other phases check that accounting on their own server at their end too.
"""

from __future__ import annotations

import asyncio
import json
import math
import statistics
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
from blendserve.engines.config import Health
from blendserve.scheduler.failures import backoff_s
from blendserve.testing.abuse import drop_jobs, gauge
from blendserve.testing.accounting import Accounting, settle_accounting
from blendserve.testing.fake_openai import FakeServer, FakeState

from bench.load.abuse.server import rss_kib, serve

__all__ = ["FAULT_PHASES"]

MESSAGES = [{"role": "user", "content": "What is 6 * 7?"}]
#: Python's words that must never reach a client.
INTERNALS = ("Traceback", "object has no attribute", "RecursionError", "recursion")


def _solve(budget: int, questions: int = 1) -> dict[str, Any]:
    asked = [{"id": f"q{i}", "messages": MESSAGES} for i in range(questions)]
    return {"questions": asked, "budget": budget, "answer": {"kind": "number"}}


def _chat(stream: bool = False, voted: bool = True) -> dict[str, Any]:
    options = {"answer": "number", "budget_per_question": 8} if voted else {"enabled": False}
    return {"model": "fake-model", "messages": MESSAGES, "stream": stream, "blendserve": options}


def _fake(**knobs: Any) -> FakeServer:
    """A fake upstream (no model) on loopback, started."""
    return FakeServer(FakeState(record=False, **knobs)).start()


def _json(text: str) -> Any:
    """``text`` parsed, or None where it is no JSON (or nested too deep for Python's parser)."""
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        return None


def _post(url: str, body: dict[str, Any], timeout: float = 120.0) -> tuple[int, str, float]:
    """Status, text and seconds of one request; a streamed one is read to its end."""
    started = time.monotonic()
    try:
        with httpx.stream("POST", url, json=body, timeout=timeout) as reply:
            text = reply.read().decode(errors="replace")
            return reply.status_code, text, time.monotonic() - started
    except httpx.HTTPError as exc:
        return 0, f"{type(exc).__name__}: {exc}", time.monotonic() - started


def _succeeded(status: int, text: str, route: str) -> bool:
    if status != 200:
        return False
    return route != "/solve" or json.loads(text)["status"] == "completed"


def _settled(url: str, name: str) -> tuple[bool, str]:
    """The accounting once settled (10 s at most), in words; True when it holds."""
    accounting, waited = settle_accounting(url, timeout=10.0)
    holds = accounting.holds()
    verdict = "holds" if holds else f"does NOT hold after {waited:.1f} s"
    return holds, f"{name}: accounting {verdict}: {accounting.describe()}"


def _p(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, math.ceil(q * len(ordered)) - 1)]


# --- breaker --------------------------------------------------------------------------


def _until_answered(url: str, route: str, body: dict[str, Any], since: float) -> tuple[float, int]:
    """Seconds from ``since`` to the first successful request of ``route``, and the tries."""
    tries = 0
    while time.monotonic() - since < 30:
        tries += 1
        status, text, _ = _post(f"{url}{route}", body)
        if _succeeded(status, text, route):
            return time.monotonic() - since, tries
    return math.inf, tries


def _outage(fake: FakeServer, url: str, longer: float) -> tuple[str, bool]:
    """The upstream down until its breaker is open (and ``longer`` s more), then back.

    Returns the outage in words, and whether the breaker was open.
    """
    fake.kill()
    down = time.monotonic()
    status, text, took = _post(f"{url}/solve", _solve(8))  # fails: the breaker opens
    opened = gauge(url, "blendserve_upstream_healthy")
    time.sleep(longer)  # a scenario's length (the probes' phase), no synchronisation
    fake.start()  # back, on the same port
    words = (
        f"down {time.monotonic() - down:.1f} s (a /solve meanwhile: "
        f"{_json(text)['status'] if status == 200 else status} in {took:.1f} s), "
        f"breaker gauge {opened:g}"
    )
    return words, opened == 0


def breaker(outages: tuple[float, ...] = (0.0, 0.7, 1.4)) -> bool:
    """An upstream that ignores ``n``, down then back: answered within the documented reset."""
    reset = Health().probe_interval + backoff_s(64)  # a probe, then a job's longest backoff
    fake = _fake(name="ignores-n", honour_n=False, answers=("42",))
    lines: list[str] = []
    worst = 0.0
    try:
        with serve(["--upstreams", fake.url]) as served:
            url = served.url
            warm = _post(f"{url}/solve", _solve(8))  # learns that the upstream ignores n
            for longer in outages:
                outage, opened = _outage(fake, url, longer)
                back = time.monotonic()
                with ThreadPoolExecutor(2) as pool:
                    solve = pool.submit(_until_answered, url, "/solve", _solve(8), back)
                    v1 = pool.submit(_until_answered, url, "/v1/chat/completions", _chat(), back)
                    (solve_s, solve_tries), (v1_s, v1_tries) = solve.result(), v1.result()
                closed = gauge(url, "blendserve_upstream_healthy")
                worst = max(worst, solve_s, v1_s) if opened and closed == 1 else math.inf
                lines.append(
                    f"  {outage}; back: the first /solve completed after {solve_s:.2f} s "
                    f"({solve_tries} tries), the first /v1 answered after {v1_s:.2f} s "
                    f"({v1_tries} tries); breaker gauge then {closed:g}"
                )
            holds, accounting = _settled(url, "  breaker")
    finally:
        fake.kill()
    print(
        f"breaker: an upstream that ignores n (warm-up /solve {_short(warm[1]).split(':')[0]}), "
        f"{len(outages)} outages; target {reset:g} s from its return (probe interval + "
        "longest backoff)\n" + "\n".join(lines) + f"\n{accounting}"
    )
    return worst <= reset and holds


# --- keys -----------------------------------------------------------------------------


def _probe_health(url: str, stop: threading.Event, seconds: list[float]) -> None:
    while not stop.wait(0.02):
        started = time.monotonic()
        httpx.get(f"{url}/health", timeout=30)
        seconds.append(time.monotonic() - started)


def _health_for(url: str, seconds: float) -> list[float]:
    """``/health`` latencies, probed for ``seconds``."""
    stop, latencies = threading.Event(), list[float]()
    probe = threading.Thread(target=_probe_health, args=(url, stop, latencies))
    probe.start()
    stop.wait(seconds)
    stop.set()
    probe.join()
    return latencies


def _ms(latencies: list[float]) -> str:
    return (
        f"p50 {statistics.median(latencies) * 1000:.0f} ms, "
        f"p99 {_p(latencies, 0.99) * 1000:.0f} ms, max {max(latencies) * 1000:.0f} ms"
    )


def keys(questions: int = 100, budget: int = 8, rounds: int = 10) -> bool:
    """Math answers whose sympy expansion explodes: bounded replies, memory and ``/health``."""
    # Questions of their own each round: no key comes from the cache.
    asked = range(rounds * questions)
    records = [{"id": f"q{i}", "answers": [f"(9x+{99 + i})^{{1000}}"]} for i in asked]
    records.append({"id": "warm", "answers": ["\\frac{1}{2}"]})
    bodies = [
        {
            "questions": [{"id": f"q{r * questions + i}", "prompt": "?"} for i in range(questions)],
            "budget": budget * questions,
            "answer": {"kind": "math"},
        }
        for r in range(rounds)
    ]
    warm = {"questions": [{"id": "warm", "prompt": "warm"}], "budget": 4, "answer": "math"}
    health: list[float] = []
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "keys.jsonl"
        data.write_text("".join(json.dumps(r) + "\n" for r in records))
        with serve(["--engine", "replay", "--data", str(data)]) as served:
            _post(f"{served.url}/solve", warm)  # the sympy workers start
            idle = rss_kib(served.pid), rss_kib(served.pid, children=True)
            quiet = _health_for(served.url, 2.0)
            stop = threading.Event()
            probe = threading.Thread(target=_probe_health, args=(served.url, stop, health))
            probe.start()
            replies = [_post(f"{served.url}/solve", body) for body in bodies]
            stop.set()
            probe.join()
            after = rss_kib(served.pid), rss_kib(served.pid, children=True)
            holds, accounting = _settled(served.url, "keys")
    sizes = [len(text.encode()) for _, text, _ in replies]
    statuses = [
        json.loads(text)["status"] if status == 200 else status for status, text, _ in replies
    ]
    answer = json.loads(replies[0][1])["answers"][0]["answer"] if replies[0][0] == 200 else None
    p99 = _p(health, 0.99)
    print(
        f"keys: {rounds} /solve of {questions} questions ({budget * questions} samples) "
        f"answered \\boxed{{(9x+k)^{{1000}}}}: {dict(Counter(statuses))}, "
        f"{max(sizes) / 1000:.1f} kB at most, in "
        f"{', '.join(f'{s:.2f}' for *_, s in replies)} s; an answer reads {answer!r}; server RSS "
        f"{idle[0] / 1024:.0f} -> {after[0] / 1024:.0f} MiB (with its sympy workers "
        f"{idle[1] / 1024:.0f} -> {after[1] / 1024:.0f} MiB); /health over {len(health)} probes "
        f"{_ms(health)} (idle before: {_ms(quiet)})\n  {accounting}"
    )
    completed = statuses == ["completed"] * rounds
    return completed and max(sizes) < 1_000_000 and p99 < 0.2 and holds


# --- hung -----------------------------------------------------------------------------

#: The requests of the hung and nested phases: route and body.
REQUESTS: dict[str, tuple[str, dict[str, Any]]] = {
    "/solve": ("/solve", _solve(4)),
    "/v1": ("/v1/chat/completions", _chat()),
    "/v1 streamed": ("/v1/chat/completions", _chat(stream=True)),
    "passed through": ("/v1/chat/completions", _chat(voted=False)),
}


def _short(text: str) -> str:
    """A reply's error (a stream's error chunk, ``/solve``'s status), else its start."""
    events = [line[6:] for line in text.splitlines() if line.startswith("data: {")]
    for body in [text, *events]:
        reply = _json(body)
        if isinstance(reply, dict) and isinstance(reply.get("error"), dict):
            return f"error {reply['error'].get('message')!r}"[:100]
        if isinstance(reply, dict) and "status" in reply:
            return f"{reply['status']}: {reply.get('error')!r}"[:100]
    return text[:60].replace("\n", " ")


def hung(upstream_timeout: float = 3.0, failure_timeout: float = 2.0, margin: float = 1.0) -> bool:
    """An upstream that never answers: each request ends within its timeouts and ``margin``."""
    fake = _fake(name="hung", timeout_rate=1.0)
    flags = [
        "--upstreams", fake.url,
        "--upstream-timeout", f"{upstream_timeout:g}",
        "--job-failure-timeout", f"{failure_timeout:g}",
    ]  # fmt: skip
    try:
        with serve(flags) as served, ThreadPoolExecutor(len(REQUESTS)) as pool:
            futures = {
                name: pool.submit(_post, f"{served.url}{route}", body)
                for name, (route, body) in REQUESTS.items()
            }
            results = {name: future.result() for name, future in futures.items()}
            holds, accounting = _settled(served.url, "hung")
    finally:
        fake.kill()
    target = upstream_timeout + failure_timeout + margin
    lines = [
        f"  {name}: {status} after {took:.2f} s: {_short(text)}"
        for name, (status, text, took) in results.items()
    ]
    print(
        f"hung: --upstream-timeout {upstream_timeout:g} --job-failure-timeout {failure_timeout:g}, "
        f"target {target:g} s\n" + "\n".join(lines) + f"\n  {accounting}"
    )
    ended = all(status != 0 and took <= target for status, _, took in results.values())
    return ended and holds


# --- nested ---------------------------------------------------------------------------


def _contract(name: str, status: int, text: str) -> str | None:
    """What is wrong with a reply to a nested upstream body (None: the error contract)."""
    if status == 0:
        return "no reply"
    if any(words in text for words in INTERNALS):
        return "Python internals"
    if name == "passed through":  # a proxy's reply: the upstream's body, unparsed
        return None if status == 200 or _error_body(text) else "not relayed"
    reply = _json(text)
    if name.endswith("streamed") and status == 200:
        events = [_json(line[6:]) for line in text.splitlines() if line.startswith("data: {")]
        ok = any(isinstance(e, dict) and _error_body(json.dumps(e)) for e in events)
        return None if ok else "no error chunk"
    if name == "/solve" and status == 200:
        failed = isinstance(reply, dict) and reply.get("status") == "failed"
        return None if failed and reply.get("error") else "not failed"
    if name == "/v1/models" and status == 200:
        ok = isinstance(reply, dict) and reply.get("object") == "list"
        return None if ok else "not a model list"
    return None if status >= 500 and _error_body(text) else "not the error contract"


def _error_body(text: str) -> bool:
    reply = _json(text)
    error = reply.get("error") if isinstance(reply, dict) else None
    return isinstance(error, dict) and all(
        isinstance(error.get(k), str) for k in ("message", "type")
    )


def nested(depth: int = 200_000) -> bool:
    """Upstream replies nested ``depth`` deep: the error contract, no internals, accounted."""
    fake = _fake(name="nested", nested=depth)
    lines: list[str] = []
    ok = True
    try:
        for streamed in (False, True):
            flags = ["--upstreams", fake.url] + (["--upstream-stall-timeout", "30"] * streamed)
            with serve(flags) as served:
                replies = {
                    name: _post(f"{served.url}{route}", body)
                    for name, (route, body) in REQUESTS.items()
                }
                started = time.monotonic()
                models = httpx.get(f"{served.url}/v1/models", timeout=60)
                took = time.monotonic() - started
                replies["/v1/models"] = (models.status_code, models.text, took)
                holds, accounting = _settled(served.url, "  accounting")
            lines.append(f" upstream requests {'streamed' if streamed else 'not streamed'}:")
            for name, (status, text, seconds) in replies.items():
                wrong = _contract(name, status, text)
                ok = ok and wrong is None
                said = "relayed as is" if name == "passed through" and status == 200 else ""
                lines.append(
                    f"  {name}: {status} in {seconds * 1000:.0f} ms, {len(text)} bytes"
                    f"{'' if wrong is None else ' WRONG: ' + wrong}: {said or _short(text)}"
                )
            lines.append(accounting)
            ok = ok and holds
    finally:
        fake.kill()
    print(f"nested: upstream bodies nested {depth:,} deep\n" + "\n".join(lines))
    return ok


# --- accounting -----------------------------------------------------------------------


def _set(fake: FakeServer, **knobs: Any) -> None:
    """The fake upstream's faults: ``knobs``, every other one off."""
    faults = {"error_rate": 0.0, "drop_rate": 0.0, "timeout_rate": 0.0, "nested": 0}
    for knob, value in {**faults, "latency": 0.01, **knobs}.items():
        setattr(fake.state, knob, value)


def _round(url: str, solves: int, chats: int, budget: int = 16) -> list[int]:
    """``solves`` jobs of 4 questions and ``chats`` voted ``/v1`` requests at once: statuses."""
    bodies = [("/solve", _solve(budget, 4))] * solves + [("/v1/chat/completions", _chat())] * chats
    with ThreadPoolExecutor(len(bodies)) as pool:
        return [r[0] for r in pool.map(lambda b: _post(f"{url}{b[0]}", b[1]), bodies)]


def _errors(fake: FakeServer, url: str) -> list[int]:
    _set(fake, error_rate=0.2, drop_rate=0.05)
    return _round(url, 4, 8)


def _hung(fake: FakeServer, url: str) -> list[int]:
    _set(fake, timeout_rate=1.0)
    return _round(url, 1, 1)


def _nested(fake: FakeServer, url: str) -> list[int]:
    _set(fake, nested=200_000)
    return _round(url, 1, 1)


def _leave(fake: FakeServer, url: str) -> list[int]:
    _set(fake, latency=1.0)
    asyncio.run(drop_jobs(url, 20, at_once=10))  # 20 streams and 10 plain jobs
    return []


def _kill_mid_job(fake: FakeServer, url: str) -> list[int]:
    _set(fake, latency=0.05)
    served = fake.state.samples_served
    with ThreadPoolExecutor(1) as pool:
        job = pool.submit(_post, f"{url}/solve", _solve(400, 4))
        deadline = time.monotonic() + 10
        while fake.state.samples_served < served + 20 and time.monotonic() < deadline:
            time.sleep(0.01)
        fake.kill()
        status = job.result()[0]
    fake.start()
    return [status]


#: The accounting phase's faults, in turn: what each does, and its run.
FAULTS: list[tuple[str, Callable[[FakeServer, str], list[int]]]] = [
    ("20% 500s, 5% dropped connections, n ignored", _errors),
    ("hung", _hung),
    ("nested 200,000 deep", _nested),
    ("clients that leave 20 streams and 10 plain jobs", _leave),
    ("the upstream killed mid-job", _kill_mid_job),
]


def _taking_requests(url: str) -> None:
    """Waits (10 s at most) until the upstream's breaker lets a request through."""
    deadline = time.monotonic() + 10
    while gauge(url, "blendserve_upstream_healthy") < 0.5 and time.monotonic() < deadline:
        time.sleep(0.05)


def accounting() -> bool:
    """Faults one after another against one server; then every dispatched sample ended once."""
    fake = _fake(name="faults", honour_n=False, answers=("7", "8"))
    flags = ["--upstreams", fake.url, "--upstream-timeout", "2", "--job-failure-timeout", "2"]
    lines: list[str] = []
    readings: list[Accounting] = []
    try:
        with serve(flags) as served:
            for name, fault in FAULTS:
                _taking_requests(served.url)
                started = time.monotonic()
                statuses = fault(fake, served.url)
                took = time.monotonic() - started
                reading, waited = settle_accounting(served.url, timeout=10.0)
                readings.append(reading)
                lines.append(
                    f"  {name}: statuses {dict(Counter(statuses))} in {took:.1f} s; settled in "
                    f"{waited:.2f} s: {reading.describe()}"
                )
    finally:
        fake.kill()
    final = readings[-1]
    print("accounting: one server, the faults in turn, read after each\n" + "\n".join(lines))
    print(f"  in all: {'holds' if final.holds() else 'does NOT hold'}: {final.describe()}")
    return all(r.holds() for r in readings) and final.total("failed") > 0 < final.total("cancelled")


#: Phase name -> its run (True: its checks passed).
FAULT_PHASES: dict[str, Callable[[], bool]] = {
    "breaker": breaker,
    "keys": keys,
    "hung": hung,
    "nested": nested,
    "accounting": accounting,
}
