"""Samples per second one process pushes through OpenAIEngine.

Usage: python -m bench.engines.openai_engine [--upstream process|mock] [--n 1,8]
           [--concurrency 256] [--seconds 5] [--replicas 1]

``process`` (the default, the honest number): the fake upstream of
:mod:`blendserve.testing.fake_openai` runs in separate processes (uvicorn, zero
latency) and is reached over loopback HTTP; the samples the fakes report
serving are checked against the samples the engine returned. ``mock``: an
in-process ``httpx2.MockTransport`` answers without any network or server, so
the figure is the client-side ceiling (engine plus httpx2).

A closed loop of ``--concurrency`` callers each awaits ``generate`` for one
question (ids cycle over 1,000, so affinity hashing is exercised) and calls
again, for ``--seconds`` after a one-second warm-up. Besides samples and
requests per second it prints the CPU this (client) process used per sample:
on a small machine the fakes compete with the client for cores, and that
figure is what the engine itself costs.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import time

import httpx
import httpx2
from blendserve.engines import GenerateRequest, SamplingParams
from blendserve.engines.config import Limits
from blendserve.engines.openai import OpenAIEngine


def spawn_fake(*flags: str) -> tuple[subprocess.Popen[str], str]:
    """The fake upstream of :mod:`blendserve.testing.fake_openai` in a process of its own,
    with ``flags``, once it answers: the process and its base URL."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "blendserve.testing.fake_openai", "--port", "0", *flags],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline().split()
    if len(line) != 2 or line[0] != "PORT":
        proc.kill()
        raise RuntimeError(f"fake upstream did not start: {line}")
    url = f"http://127.0.0.1:{line[1]}/v1"
    deadline = time.monotonic() + 20
    while True:
        try:
            if httpx.get(url + "/models", timeout=1).status_code == 200:
                return proc, url
        except httpx.TransportError:
            pass
        if time.monotonic() > deadline:
            proc.kill()
            raise RuntimeError("fake upstream not ready in 20 s")
        time.sleep(0.05)


def _mock_transport() -> httpx2.MockTransport:
    def handler(request: httpx2.Request) -> httpx2.Response:
        n = json.loads(request.content).get("n", 1)
        choices = [
            {"index": i, "message": {"role": "assistant", "content": "x"}, "finish_reason": "stop"}
            for i in range(n)
        ]
        usage = {"prompt_tokens": 3, "completion_tokens": 5 * n}
        return httpx2.Response(200, json={"choices": choices, "usage": usage})

    return httpx2.MockTransport(handler)


async def _served(urls: list[str]) -> int:
    async with httpx.AsyncClient() as client:
        stats = [(await client.get(url.removesuffix("/v1") + "/fake/stats")).json() for url in urls]
    return sum(int(s["samples_served"]) for s in stats)


async def _measure(
    engine: OpenAIEngine, n: int, concurrency: int, seconds: float
) -> tuple[int, float, float, int]:
    """Runs the closed loop.

    Returns:
        (samples timed, seconds timed, CPU seconds of this process while timed,
        samples in all).
    """
    counting = stop = False
    timed = total = 0
    params = SamplingParams(temperature=1.0, max_tokens=16)
    messages = [{"role": "user", "content": "What is 2+2?"}]

    async def caller(index: int) -> None:
        nonlocal timed, total
        i = index
        while not stop:
            request = GenerateRequest(
                messages=messages, n=n, params=params, question_id=f"q{i % 1000}"
            )
            got = len(await engine.generate(request))
            total += got
            if counting:
                timed += got
            i += concurrency

    tasks = [asyncio.ensure_future(caller(i)) for i in range(concurrency)]
    await asyncio.sleep(1.0)  # warm-up: connections open, code paths hot
    counting = True
    start, cpu = time.perf_counter(), time.process_time()
    await asyncio.sleep(seconds)
    counting = False
    elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu
    stop = True
    await asyncio.gather(*tasks)
    return timed, elapsed, cpu, total


async def _bench(args: argparse.Namespace) -> None:
    procs: list[subprocess.Popen[str]] = []
    urls: list[str] = []
    transport: httpx2.AsyncBaseTransport | None = None
    try:
        if args.upstream == "process":
            for i in range(args.replicas):
                proc, url = spawn_fake("--name", f"r{i}")
                procs.append(proc)
                urls.append(url)
        else:
            urls = [f"http://mock-{i}.invalid/v1" for i in range(args.replicas)]
            transport = _mock_transport()
        print(
            f"upstream={args.upstream} replicas={args.replicas} "
            f"concurrency={args.concurrency} seconds={args.seconds} cpus={os.cpu_count()}"
        )
        for n in (int(v) for v in args.n.split(",")):
            engine = OpenAIEngine(
                urls, transport=transport, limits=Limits(connections=max(args.concurrency, 1))
            )
            async with engine:
                before = await _served(urls) if procs else 0
                timed, elapsed, cpu, total = await _measure(
                    engine, n, args.concurrency, args.seconds
                )
                check = ""
                if procs:
                    served = await _served(urls) - before
                    verdict = "OK" if served == total else "MISMATCH"
                    check = f"  served={served} returned={total} {verdict}"
            print(
                f"n={n:<3d} {timed / elapsed:9.0f} samples/s  {timed / n / elapsed:8.0f} requests/s"
                f"  client CPU {cpu / elapsed:4.0%}, {cpu / timed * 1e6:5.0f} us/sample{check}",
                flush=True,
            )
    finally:
        for proc in procs:
            proc.terminate()
            proc.wait(10)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--upstream", choices=["process", "mock"], default="process")
    parser.add_argument("--n", default="1,8", help="comma-separated n values")
    parser.add_argument("--concurrency", type=int, default=256)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--replicas", type=int, default=1)
    args = parser.parse_args()
    asyncio.run(_bench(args))


if __name__ == "__main__":
    main()
