"""Online self-consistency through ``/v1`` with the official SDK, against the grouping window.

Usage: python bench/bench_online.py [DATA_DIR] [--questions 300] [--concurrency 1,8,64]

For each recorded set (questions in a seeded random order), a real uvicorn
server on loopback over the replay engine (``--latency`` seconds a request)
answers chat completions sent by ``openai.AsyncOpenAI`` at each client
concurrency, once in the default online mode and once with the 50 ms grouping
window (``sc_mode=grouped``). Prints mean samples per question, reducible
error (answers that are not the recorded mode), request latency p50/p99,
engine rounds per question and the pacing error after 100, 200 and 500
questions. Every loop is bounded by the question count.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import openai
import uvicorn
from blendserve.engines.replay import LatencyModel, ReplayEngine
from blendserve.service import Settings, create_app

# Mean budgets at which the simulator's online method reaches SC@32's error.
BUDGETS = {
    "esc_lastletters_gpt35.jsonl": 5.2,
    "faithfulcot_date_codex_ltm.jsonl": 3.2,
    "trove_math_codellama7b_pot.jsonl": 19.0,
}


def _records(path: Path, limit: int, seed: int) -> list[dict[str, Any]]:
    kept = []
    for line in path.read_text().splitlines():
        record = json.loads(line) if line.strip() else None
        answers = [a for a in (record or {}).get("answers", []) if a is not None]
        counts = sorted((answers.count(a) for a in set(answers)), reverse=True)
        if record and len(answers) >= 8 and (len(counts) == 1 or counts[0] > counts[1]):
            record["mode"] = max(set(answers), key=answers.count)
            kept.append(record)
    random.Random(seed).shuffle(kept)
    return kept[:limit]


def _serve(engine: ReplayEngine, **settings: Any) -> tuple[uvicorn.Server, threading.Thread, str]:
    async def factory() -> ReplayEngine:
        return engine

    app = create_app(Settings(**settings), engine_factory=factory)
    server = uvicorn.Server(uvicorn.Config(app, port=0, log_level="warning", access_log=False))
    thread = threading.Thread(target=lambda: asyncio.run(server.serve()), daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.01)
    port = server.servers[0].sockets[0].getsockname()[1]
    return server, thread, f"http://127.0.0.1:{port}/v1"


async def _ask_all(
    url: str, records: list[dict[str, Any]], concurrency: int, budget: float
) -> list[tuple[float, dict[str, Any]]]:
    gate = asyncio.Semaphore(concurrency)
    options = {"blendserve": {"answer": "exact", "budget_per_question": budget}}
    results: list[tuple[float, dict[str, Any]]] = []
    async with openai.AsyncOpenAI(base_url=url, api_key="x", max_retries=0) as client:

        async def one(record: dict[str, Any]) -> None:
            async with gate:
                start = time.perf_counter()
                reply = await client.chat.completions.create(
                    model="replay",
                    messages=[{"role": "user", "content": str(record["id"])}],
                    extra_body=options,
                )
                vote = (reply.model_extra or {})["blendserve"]
                vote["correct"] = vote["answer"] == str(record["mode"])
                results.append((time.perf_counter() - start, vote))

        await asyncio.gather(*(one(r) for r in records))
    return results


def run(
    records: list[dict[str, Any]], mode: str, concurrency: int, budget: float, latency: float
) -> dict[str, Any]:
    """One pass over ``records``; the numbers of one table row."""
    engine = ReplayEngine(records, seed=concurrency, latency=LatencyModel(fixed=latency))
    settings = {"sc_mode": mode, "default_concurrency": 64, "max_concurrent_jobs": 256}
    server, thread, url = _serve(engine, **settings)
    try:
        results = asyncio.run(_ask_all(url, records, concurrency, budget))
        pools = server.config.app.state.grouper.pools.pools.values()
        rounds = sum(p.num_rounds for p in pools)
    finally:
        server.should_exit = True
        thread.join(timeout=30)
    latencies = np.array([t for t, _ in results])
    samples = np.array([v["samples"] for _, v in results])
    running = np.cumsum(samples) / np.arange(1, len(samples) + 1)

    def pacing(k: int) -> str:
        return f"{running[k - 1] / budget - 1:+.1%}" if len(samples) >= k else "-"

    return {
        "samples": float(samples.mean()),
        "error": 1 - float(np.mean([v["correct"] for _, v in results])),
        "p50_ms": 1000 * float(np.percentile(latencies, 50)),
        "p99_ms": 1000 * float(np.percentile(latencies, 99)),
        "rounds": rounds / len(results) if mode == "online" else float("nan"),
        "requests_per_q": engine.stats.requests / len(results),
        "pacing": " / ".join(pacing(k) for k in (100, 200, 500)),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("data_dir", type=Path, nargs="?", default=Path("../shared/data"))
    parser.add_argument("--questions", type=int, default=300)
    parser.add_argument("--concurrency", default="1,8,64")
    parser.add_argument("--latency", type=float, default=0.02, help="seconds per engine request")
    parser.add_argument("--modes", default="online,grouped")
    parser.add_argument("--files", default=",".join(BUDGETS))
    args = parser.parse_args()
    print(
        "| data | mode | clients | budget | samples/q | error | p50 ms | p99 ms "
        "| rounds/q | requests/q | pacing @100/200/500 |"
    )
    print("|" + "---|" * 11)
    for name in args.files.split(","):
        records = _records(args.data_dir / name, args.questions, seed=0)
        for concurrency in (int(c) for c in args.concurrency.split(",")):
            for mode in args.modes.split(","):
                row = run(records, mode, concurrency, BUDGETS[name], args.latency)
                print(
                    f"| {Path(name).stem} ({len(records)} q) | {mode} | {concurrency} "
                    f"| {BUDGETS[name]:g} | {row['samples']:.2f} | {row['error']:.3f} "
                    f"| {row['p50_ms']:.0f} | {row['p99_ms']:.0f} | {row['rounds']:.2f} "
                    f"| {row['requests_per_q']:.2f} | {row['pacing']} |",
                    flush=True,
                )


if __name__ == "__main__":
    main()
