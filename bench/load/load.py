"""A bounded load test: many concurrent clients against ``blendserve serve`` on the replay engine.

Starts the real command (``blendserve serve --engine replay``) as a subprocess
on loopback, runs ``--clients`` concurrent clients for ``--duration`` seconds
(a mix of ``POST /solve`` with a few questions and ``POST /v1/chat/completions``),
twice, then stops by itself. It prints requests, errors by status, p50/p99
latency and throughput of each run, and leak checks: the server's RSS, open
file descriptors and sockets, and the ``blendserve_active_jobs`` and
``blendserve_in_flight_samples`` gauges, which must return to their idle
values after each run; RSS and descriptors must not keep growing in the
second run. Exits 1 when a leak check fails.

Usage: python -m bench.load.load DATA.jsonl [--clients 200] [--duration 60]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import httpx

_GAUGES = ("blendserve_active_jobs", "blendserve_in_flight_samples", "blendserve_queued_questions")


@dataclass
class RunStats:
    """What one load run measured."""

    latencies: dict[str, list[float]] = field(default_factory=dict)
    statuses: Counter[str] = field(default_factory=Counter)
    #: (seconds into the run, route, what went wrong) of the first failures
    failures: list[tuple[float, str, str]] = field(default_factory=list)
    started: float = 0.0
    elapsed: float = 0.0
    client_cpu: float = 0.0


@dataclass(frozen=True)
class Snapshot:
    """The server process's resources at one moment."""

    rss_kib: int
    cpu_s: float
    fds: int
    sockets: int
    gauges: dict[str, float]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _record_ids(path: Path) -> list[str]:
    ids = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.strip():
            ids.append(str(json.loads(line)["id"]))
    return ids


def _gauges(text: str) -> dict[str, float]:
    values = {}
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        if name in _GAUGES:
            values[name] = float(value)
    return values


def _snapshot(pid: int, url: str) -> Snapshot:
    status = Path(f"/proc/{pid}/status").read_text()
    rss = next(int(line.split()[1]) for line in status.splitlines() if line.startswith("VmRSS:"))
    fds = os.listdir(f"/proc/{pid}/fd")
    sockets = 0
    for fd in fds:
        with contextlib.suppress(OSError):  # closed between listing and reading
            sockets += os.readlink(f"/proc/{pid}/fd/{fd}").startswith("socket:")
    # utime and stime, fields 14 and 15 of /proc/PID/stat (after the parenthesised name)
    times = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[11:13]
    cpu = sum(int(t) for t in times) / os.sysconf("SC_CLK_TCK")
    metrics = httpx.get(f"{url}/metrics", timeout=10).text
    return Snapshot(rss, cpu, len(fds), sockets, _gauges(metrics))


def _settled(pid: int, url: str, idle: Snapshot, timeout: float) -> Snapshot:
    """Polls until the gauges are back to zero and sockets to the idle count, or the deadline."""
    deadline = time.monotonic() + timeout
    while True:
        now = _snapshot(pid, url)
        back = all(v == 0 for v in now.gauges.values()) and now.sockets <= idle.sockets
        if back or time.monotonic() > deadline:
            return now
        time.sleep(0.1)


async def _client(
    http: httpx.AsyncClient,
    ids: list[str],
    stats: RunStats,
    deadline: float,
    rng: random.Random,
    args: argparse.Namespace,
) -> None:
    while time.monotonic() < deadline:
        if rng.random() < args.chat_share:
            route = "/v1/chat/completions"
            body: dict[str, object] = {
                "messages": [{"role": "user", "content": rng.choice(ids)}],
                "blendserve": {"budget_per_question": args.budget_per_question},
            }
        else:
            route = "/solve"
            chosen = rng.sample(ids, args.questions)
            body = {
                "questions": [{"id": q, "prompt": q} for q in chosen],
                "budget_per_question": args.budget_per_question,
            }
        started = time.monotonic()
        try:
            response = await http.post(route, json=body)
            label = str(response.status_code)
            if response.status_code == 200 and route == "/solve":
                job_status = response.json()["status"]
                if job_status != "completed":
                    label = f"200-job-{job_status}"
        except httpx.HTTPError as exc:
            label = type(exc).__name__
            response = None
            error = f"{label}: {exc!r}"
        latency = time.monotonic() - started
        stats.latencies.setdefault(route, []).append(latency)
        stats.statuses[label] += 1
        if label != "200" and len(stats.failures) < 5:
            detail = response.text[:200] if response is not None else error
            offset = started - stats.started
            stats.failures.append((offset, route, f"{detail} after {latency:.3f} s"))
        if response is not None and response.status_code == 429:
            await asyncio.sleep(min(float(response.headers.get("retry-after", 1)), 1.0))


async def _load(
    url: str,
    ids: list[str],
    args: argparse.Namespace,
    *,
    seed: int,
    clients: range,
    duration: float,
) -> RunStats:
    stats = RunStats()
    # uvicorn closes a connection idle for 5 s: a client reusing one at that moment
    # reads EOF (httpx.ReadError). Idle connections are dropped sooner on this side.
    limits = httpx.Limits(
        max_connections=len(clients), max_keepalive_connections=len(clients), keepalive_expiry=2.0
    )
    async with httpx.AsyncClient(base_url=url, limits=limits, timeout=args.timeout) as http:
        stats.started = started = time.monotonic()
        cpu = time.process_time()
        deadline = started + duration
        await asyncio.gather(
            *(
                _client(http, ids, stats, deadline, random.Random(seed * 100_003 + i), args)
                for i in clients
            )
        )
        stats.elapsed = time.monotonic() - started
        stats.client_cpu = (time.process_time() - cpu) / stats.elapsed
    return stats


def _load_in_process(
    url: str, ids: list[str], args: argparse.Namespace, seed: int, clients: range
) -> RunStats:
    return asyncio.run(_load(url, ids, args, seed=seed, clients=clients, duration=args.duration))


def _run(url: str, ids: list[str], args: argparse.Namespace, seed: int) -> RunStats:
    """One run: the clients split over ``args.processes`` processes (one event loop
    cannot drive hundreds of httpx connections without becoming the bottleneck)."""
    share = -(-args.clients // args.processes)
    parts = [range(i, min(i + share, args.clients)) for i in range(0, args.clients, share)]
    with ProcessPoolExecutor(len(parts)) as pool:
        futures = [pool.submit(_load_in_process, url, ids, args, seed, part) for part in parts]
        results = [future.result() for future in futures]
    merged = RunStats(elapsed=max(r.elapsed for r in results))
    for result in results:
        for route, values in result.latencies.items():
            merged.latencies.setdefault(route, []).extend(values)
        merged.statuses.update(result.statuses)
        merged.failures.extend(result.failures)
        merged.client_cpu += result.client_cpu
    return merged


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def _latency(label: str, values: list[float]) -> str:
    return (
        f"{label} {len(values)}: p50 {_percentile(values, 0.5) * 1000:.0f} ms, "
        f"p99 {_percentile(values, 0.99) * 1000:.0f} ms, max {max(values) * 1000:.0f} ms"
    )


def _report(run: int, stats: RunStats) -> int:
    total = sum(stats.statuses.values())
    errors = total - stats.statuses["200"]
    rate = total / stats.elapsed
    print(f"run {run}: {total} requests in {stats.elapsed:.1f} s ({rate:.0f} req/s)")
    print(f"  statuses: {dict(sorted(stats.statuses.items()))}; errors: {errors}")
    print("  latency, " + _latency("all", [v for vs in stats.latencies.values() for v in vs]))
    for route, values in sorted(stats.latencies.items()):
        print(f"    {_latency(route, values)}")
    for offset, route, detail in stats.failures:
        print(f"  failed at {offset:.1f} s: {route}: {detail}")
    return errors


def _describe(label: str, snap: Snapshot) -> None:
    gauges = ", ".join(f"{k.removeprefix('blendserve_')}={v:g}" for k, v in snap.gauges.items())
    print(
        f"  {label}: RSS {snap.rss_kib / 1024:.1f} MiB, {snap.fds} fds "
        f"({snap.sockets} sockets); {gauges}"
    )


def _start(args: argparse.Namespace, log: Path) -> tuple[subprocess.Popen[bytes], str]:
    port = _free_port()
    command = [
        sys.executable, "-m", "blendserve.cli", "serve", "--engine", "replay",
        "--data", str(args.data), "--host", "127.0.0.1", "--port", str(port),
        "--replay-latency-s", str(args.replay_latency_s), "--log-level", "warning",
    ]  # fmt: skip
    env = {**os.environ, "BLENDSERVE_MAX_CONCURRENT_JOBS": str(args.max_concurrent_jobs)}
    with log.open("w") as stderr:
        process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=stderr, env=env)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while True:
        try:
            if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                return process, url
        except httpx.TransportError:
            pass
        if process.poll() is not None or time.monotonic() > deadline:
            process.kill()
            raise SystemExit(f"the server did not start:\n{log.read_text()}")
        time.sleep(0.1)


def main() -> int:
    """Runs the load test; the exit code is 1 when a leak check fails."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("data", type=Path, help="recorded answers (JSONL) for the replay engine")
    parser.add_argument("--clients", type=int, default=200)
    parser.add_argument("--processes", type=int, default=4, help="client processes")
    parser.add_argument("--duration", type=float, default=60.0, help="seconds per run")
    parser.add_argument("--runs", type=int, default=2, help="the last must not grow RSS or fds")
    parser.add_argument("--replay-latency-s", type=float, default=0.05)
    parser.add_argument("--questions", type=int, default=4, help="questions per /solve")
    parser.add_argument("--budget-per-question", type=float, default=6.0)
    parser.add_argument("--chat-share", type=float, default=0.5)
    parser.add_argument("--max-concurrent-jobs", type=int, default=256)
    parser.add_argument("--timeout", type=float, default=60.0, help="per request")
    parser.add_argument(
        "--rss-growth", type=float, default=0.10, help="allowed RSS growth of the last run"
    )
    args = parser.parse_args()
    ids = _record_ids(args.data)
    print(
        f"{args.clients} clients x {args.duration:g} s x {args.runs} runs; replay latency "
        f"{args.replay_latency_s:g} s; /solve {args.questions} questions, "
        f"{args.budget_per_question:g} samples each; {args.chat_share:.0%} chat"
    )
    log = Path(tempfile.mkdtemp(prefix="bench-load-")) / "server.log"
    process, url = _start(args, log)
    failures = []
    try:
        # A short warm-up first, so that lazy start-up work is not counted as a leak.
        asyncio.run(_load(url, ids, args, seed=0, clients=range(2), duration=1.0))
        idle = _settled(process.pid, url, _snapshot(process.pid, url), 10)
        _describe("idle", idle)
        after: list[Snapshot] = []
        errors = 0
        for run in range(1, args.runs + 1):
            before = _snapshot(process.pid, url)
            stats = _run(url, ids, args, seed=run)
            errors += _report(run, stats)
            just_after = _snapshot(process.pid, url)
            busy = (just_after.cpu_s - before.cpu_s) / stats.elapsed
            print(f"  CPU: server {busy:.0%}, clients {stats.client_cpu:.0%} of one core")
            _describe("just after", just_after)
            settled = _settled(process.pid, url, idle, 30)
            _describe("settled", settled)
            after.append(settled)
            if any(v != 0 for v in settled.gauges.values()):
                failures.append(f"run {run}: gauges not back to 0: {settled.gauges}")
            if settled.sockets > idle.sockets:
                failures.append(f"run {run}: {settled.sockets} sockets, {idle.sockets} when idle")
        if len(after) >= 2:
            first, last = after[-2], after[-1]
            if last.rss_kib > first.rss_kib * (1 + args.rss_growth):
                failures.append(f"RSS grew {first.rss_kib} -> {last.rss_kib} KiB in the last run")
            if last.fds > first.fds:
                failures.append(f"fds grew {first.fds} -> {last.fds} in the last run")
        print(f"errors (non-200) in all runs: {errors}")
    finally:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
    for failure in failures:
        print(f"LEAK: {failure}")
    print("leak checks:", "FAILED" if failures else "passed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
