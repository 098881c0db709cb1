"""Benchmark of answer extraction and canonical keys on the vendored GSM8K and MATH-500 items.

Measures ``number`` extract + key per GSM8K reference solution, ``math`` key
latency per MATH-500 gold answer, cold (a fresh cache: a real sympy parse in a
worker) and cached, and how many distinct plain numbers ``auto`` keys a second
(as a job keys them: concurrently, off the event loop). Worker start-up is
timed separately.

Usage::

    python -m bench.overhead.answers [--repeat 20] [--workers 1]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from pathlib import Path

from blendserve import answers

ROOT = Path(__file__).resolve().parents[2]


def _load(path: Path) -> list[dict[str, object]]:
    with path.open(encoding="utf-8") as handle:
        return [json.loads(line) for line in handle if line.strip()]


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def _row(name: str, samples: list[float], unit: str, scale: float) -> str:
    p50 = _percentile(samples, 0.5) * scale
    p99 = _percentile(samples, 0.99) * scale
    mean = statistics.fmean(samples) * scale
    return (
        f"| {name:<34} | {len(samples):>6} | {mean:>10.2f} | {p50:>10.2f} | {p99:>10.2f} | {unit} |"
    )


def bench_number(items: list[dict[str, object]], repeat: int) -> list[float]:
    """Seconds per sample of ``extract(..., "number")`` then ``canonical_key``."""
    texts = [str(item["answer"]) for item in items]
    timings: list[float] = []
    clock = time.perf_counter
    for _ in range(repeat):
        for text in texts:
            started = clock()
            answer = answers.extract(text, "number")
            if answer is not None:
                answers.canonical_key(answer, "number")
            timings.append(clock() - started)
    return timings


def bench_math(items: list[dict[str, object]], cold: bool) -> list[float]:
    """Seconds per ``canonical_key(gold, "math")``; ``cold`` clears the cache first."""
    timings: list[float] = []
    for item in items:
        if cold:
            answers.clear_cache()
        started = time.perf_counter()
        answers.canonical_key(str(item["answer"]), "math")
        timings.append(time.perf_counter() - started)
    return timings


def bench_distinct_numbers(count: int) -> float:
    """Distinct numeric ``auto`` answers extracted and keyed a second, all at once."""
    texts = [f"so the answer is {i}.{i % 97}." for i in range(1000, 1000 + count)]

    async def run() -> float:
        started = time.perf_counter()
        await asyncio.gather(*(answers.aextract(text, "auto") for text in texts))
        return count / (time.perf_counter() - started)

    return asyncio.run(run())


def main(argv: list[str] | None = None) -> int:
    """Runs the benchmark and prints a table."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    fixtures = ROOT / "tests" / "fixtures"
    parser.add_argument("--gsm8k", type=Path, default=fixtures / "gsm8k_test_200.jsonl")
    parser.add_argument("--math500", type=Path, default=fixtures / "math500_200.jsonl")
    parser.add_argument("--repeat", type=int, default=20, help="passes over the GSM8K items")
    parser.add_argument("--workers", type=int, default=1, help="sympy worker processes")
    args = parser.parse_args(argv)

    gsm8k = _load(args.gsm8k)
    math500 = _load(args.math500)
    answers.configure(workers=args.workers)

    started = time.perf_counter()
    answers.warm_up()
    startup = time.perf_counter() - started

    try:
        bench_number(gsm8k, 1)  # warm the regex caches
        number = bench_number(gsm8k, args.repeat)
        cold = bench_math(math500, cold=True)
        answers.clear_cache()
        bench_math(math500, cold=False)  # fill the cache
        cached = bench_math(math500, cold=False)
        numbers_per_s = bench_distinct_numbers(2000)
        info = answers.cache_info()
    finally:
        answers.shutdown()

    print(f"python {sys.version.split()[0]}, {args.workers} sympy worker(s)")
    print(f"worker start-up (import sympy, warm parse): {startup:.2f} s\n")
    print(f"| {'measure':<34} | {'n':>6} | {'mean':>10} | {'p50':>10} | {'p99':>10} | unit |")
    print(f"|{'-' * 36}|{'-' * 8}|{'-' * 12}|{'-' * 12}|{'-' * 12}|------|")
    print(_row("number extract+key (GSM8K)", number, "us", 1e6))
    print(_row("math key, cold (MATH-500 gold)", cold, "ms", 1e3))
    print(_row("math key, cached (MATH-500 gold)", cached, "us", 1e6))
    print(f"\nauto keys of 2,000 distinct numbers: {numbers_per_s:,.0f} a second")
    print(f"math key timeouts: {info.timeouts}, pool errors: {info.errors}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
