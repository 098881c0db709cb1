"""Scheduler benchmarks on the replay engine (our fake model).

1. Overhead: samples/s through the whole service (HTTP ``POST /solve`` on a
   real uvicorn server on loopback) against a zero-latency replay engine, for a warm
   server and for its first job.
2. Wall time to reach SC@64's accuracy on recorded data with a replay engine
   whose capacity is limited like a GPU batch (64 concurrent sequences,
   200 tokens/s each): vanilla SC sending ``n=64`` per question versus a
   Blend-ASC job whose budget the simulator says matches SC@64.

Usage: python -m bench.overhead.scheduler DATA.jsonl [--questions 200]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path
from typing import Any

import httpx
from blendserve.answers import make_keyer
from blendserve.engines.replay import LatencyModel, ReplayEngine
from blendserve.scheduler import AnswerEvent, Job, JobSpec, Question
from blendserve.service import Settings

from bench.service import serve


def _records(path: Path, limit: int) -> list[dict[str, Any]]:
    records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    kept = []
    for record in records:
        answers = [a for a in record["answers"] if a is not None]
        counts = sorted((answers.count(a) for a in set(answers)), reverse=True)
        if len(answers) >= 8 and (len(counts) == 1 or counts[0] > counts[1]):
            record["mode"] = max(set(answers), key=answers.count)
            kept.append(record)
    return kept[:limit]


def overhead(records: list[dict[str, Any]], budget_per_question: int) -> list[float]:
    """Samples/s of one big /solve job through HTTP, zero-latency replay engine: the
    server's first job (its kernels still compiling beside it) and the same job again."""
    server, thread, port = serve(ReplayEngine(records), Settings(default_concurrency=256))
    body = {
        "questions": [{"id": r["id"], "prompt": str(r["id"])} for r in records],
        "budget_per_question": budget_per_question,
        "answer": {"kind": "exact"},
    }
    rates = []
    for _ in range(2):
        start = time.perf_counter()
        result = httpx.post(f"http://127.0.0.1:{port}/solve", json=body, timeout=600).json()
        rates.append(float(result["budget"]["spent"] / (time.perf_counter() - start)))
    server.should_exit = True
    thread.join()
    return rates


async def _job(records: list[dict[str, Any]], engine: ReplayEngine, **spec: Any) -> dict[str, str]:
    questions = [Question(id=r["id"], prompt=str(r["id"])) for r in records]
    job = Job(
        JobSpec(questions=questions, **spec), engine.rendering("exact"), make_keyer("exact", None)
    )
    return {e.id: e.answer or "" async for e in job.events() if isinstance(e, AnswerEvent)}


def wall_time(records: list[dict[str, Any]], blend_per_question: float) -> None:
    """SC with n=64 per question against Blend-ASC at the matching budget, GPU-like capacity."""
    latency = LatencyModel(per_token=1 / 200, max_concurrent_sequences=64)
    n = len(records)
    runs = {
        "sc (n=64 per question)": dict(budget=64 * n, policy=_sc(), concurrency=64,
                                       max_samples_per_request=64),
        f"blend ({blend_per_question}/question)": dict(budget=round(blend_per_question * n),
                                                       concurrency=64),
    }  # fmt: skip
    print("| run | wall s | reducible error |")
    print("|---|---|---|")
    for name, spec in runs.items():
        engine = ReplayEngine(records, seed=1, latency=latency)
        start = time.perf_counter()
        answers = asyncio.run(_job(records, engine, **spec))
        elapsed = time.perf_counter() - start
        wrong = sum(answers[r["id"]] != str(r["mode"]) for r in records) / n
        print(f"| {name} | {elapsed:.1f} | {wrong:.4f} |")


def _sc() -> Any:
    from blendserve.core import PolicySpec

    return PolicySpec("sc")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("data", type=Path)
    parser.add_argument("--questions", type=int, default=200)
    parser.add_argument(
        "--blend-per-question",
        type=float,
        default=16.0,
        help="Blend-ASC budget matching SC@64 (from blendserve simulate)",
    )
    args = parser.parse_args()
    records = _records(args.data, args.questions)
    first, warm = overhead(records, 64)
    print(
        f"overhead: {warm:,.0f} samples/s through POST /solve ({len(records)} questions x 64),"
        f" {first:,.0f} for the server's first job"
    )
    sys.stdout.flush()
    wall_time(records, args.blend_per_question)


if __name__ == "__main__":
    main()
