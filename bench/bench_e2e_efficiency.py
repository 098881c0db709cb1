"""End-to-end sample efficiency: the real scheduler on the replay engine, against SC measured alike.

For each recorded set, the kept questions (as the simulator keeps them) are
split into jobs of 1, 4, 16, 64 questions and one job of all questions. Each
job runs through :class:`~blendserve.scheduler.Job` with default settings
over a replay engine with exponential per-request latency and a 64-sequence
capacity, at concurrency 8, 64 and 256. We report the least budget per
question with which the default policy's reducible error (averaged over
repetitions) reaches SC@32's, SC@32 being measured through the same
scheduler; next to it, the simulator's sequential figure on the same job
split; and the modelled wall time of the whole set at that budget against
SC@32 sent as ``n=32`` per question (with no limit on samples in flight, and
with the job's concurrency). Runs on a virtual clock, so
the modelled latency costs no real time and the numbers do not depend on
the machine's load. ``--http`` also runs one configuration (esc_lastletters in 16-question
jobs, 8 samples per question against SC@32, the same answer streams, three
seeds) through a real ``POST /solve`` on loopback, in real time.

Usage: python bench/bench_e2e_efficiency.py ../shared/data [--reps 5] [--http]
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import statistics
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np
from bench_scheduler import serve
from blendserve.core.policies import PolicySpec
from blendserve.engines.base import GenerateRequest
from blendserve.engines.replay import LatencyModel, ReplayEngine
from blendserve.scheduler import AnswerEvent, DoneEvent, Job, JobSpec, Question
from blendserve.service import Settings
from blendserve.service.jobs import make_keyer
from blendserve.sim.clock import run_virtual
from blendserve.sim.data import MIN_ANSWERS, Dataset
from blendserve.sim.runner import AnswerDraws
from numpy.typing import NDArray

TARGET = 32
LATENCY = LatencyModel(fixed=0.05, exponential_mean=0.25, max_concurrent_sequences=64)


@dataclass(frozen=True)
class Record:
    """A kept question: its recorded non-null answers and their mode."""

    id: str
    answers: list[str]
    mode: str

    def distribution(self) -> tuple[list[str], NDArray[np.float64]]:
        """Distinct answers, the mode first, and their probabilities (as the simulator has them)."""
        counts = Counter(self.answers)
        ordered = [self.mode] + [a for a, _ in counts.most_common() if a != self.mode]
        probs = np.array([counts[a] for a in ordered], dtype=float) / len(self.answers)
        return ordered, probs


class StreamEngine(ReplayEngine):
    """The replay engine drawing the simulator's answer streams.

    The k-th sample of question q is the k-th draw of :class:`AnswerDraws`
    for ``(seed, q)``, whatever the order of requests: every method, the
    simulator included, sees the same answers (common random numbers).
    """

    def __init__(self, records: list[Record], seed: int, latency: LatencyModel) -> None:
        super().__init__([{"id": r.id, "answers": r.answers} for r in records], latency=latency)
        distributions = [r.distribution() for r in records]
        self.dataset = Dataset("replay", [r.id for r in records], [p for _, p in distributions])
        self._draws = AnswerDraws(self.dataset, seed)
        # question id -> (its index, its distinct answers)
        pairs = zip(records, distributions, strict=True)
        self._index = {r.id: (i, d[0]) for i, (r, d) in enumerate(pairs)}

    def _draw(self, request: GenerateRequest, recorded: list[str | None]) -> list[str | None]:
        assert request.question_id is not None
        q, answers = self._index[request.question_id]
        return [answers[self._draws.next(q)] for _ in range(request.n)]


def load(path: Path) -> list[Record]:
    """The questions the simulator keeps (enough answers, a unique mode)."""
    kept = []
    for line in path.read_text().splitlines():
        if not line.strip():
            continue
        raw = json.loads(line)
        answers = [str(a) for a in raw["answers"] if a is not None]
        top = Counter(answers).most_common(2)
        if len(answers) >= MIN_ANSWERS and (len(top) == 1 or top[0][1] > top[1][1]):
            kept.append(Record(str(raw["id"]), answers, top[0][0]))
    return kept


def split(records: list[Record], size: int | None) -> list[list[Record]]:
    """Consecutive jobs of ``size`` questions (None: one job of all)."""
    size = size or len(records)
    return [records[i : i + size] for i in range(0, len(records), size)]


async def _run_job(job_records: list[Record], engine: ReplayEngine, **spec: Any) -> tuple[int, int]:
    """Runs one job; returns (wrong answers, samples spent)."""
    questions = [Question(id=r.id, prompt=r.id) for r in job_records]
    job = Job(
        JobSpec(questions=questions, **spec),
        engine.rendering("exact"),
        make_keyer("exact", None),
    )
    wrong, spent = 0, 0
    async for event in job.events():
        if isinstance(event, AnswerEvent):
            wrong += event.answer != job_records[event.index].mode
        elif isinstance(event, DoneEvent):
            spent = event.spent
    return wrong, spent


def run_set(
    records: list[Record], size: int | None, budget_per_question: int, seed: int, **spec: Any
) -> tuple[float, float]:
    """All jobs of one split at once on one engine; returns (error, modelled seconds)."""
    engine = StreamEngine(records, seed, LATENCY)
    jobs = split(records, size)

    async def main() -> int:
        results = await asyncio.gather(
            *(
                _run_job(chunk, engine, budget=budget_per_question * len(chunk), seed=seed, **spec)
                for chunk in jobs
            )
        )
        return sum(w for w, _ in results)

    wrong, elapsed = run_virtual(main())
    return wrong / len(records), elapsed


def error_at(
    records: list[Record], size: int | None, b: int, reps: int, **spec: Any
) -> tuple[float, float]:
    """Mean error and mean modelled seconds over ``reps`` seeds."""
    runs = [run_set(records, size, b, seed, **spec) for seed in range(reps)]
    return statistics.fmean(e for e, _ in runs), statistics.fmean(t for _, t in runs)


def least_budget(error: Any, bar: float, limit: int, guess: int = 2) -> int | None:
    """Least integer budget per question in [1, limit] whose error is at most ``bar``.

    Starts from ``guess``: steps down from it while the error stays at most
    ``bar``, else bisects between it and ``limit``.
    """
    if error(limit) > bar:
        return None
    b = min(max(1, guess), limit)
    if error(b) <= bar:
        while b > 1 and error(b - 1) <= bar:
            b -= 1
        return b
    lo, hi = b, limit  # error(lo) > bar >= error(hi)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if error(mid) <= bar:
            hi = mid
        else:
            lo = mid
    return hi


def sequential_error(records: list[Record], size: int | None, b: int, reps: int) -> float:
    """The simulator's error: the same policy, one sample at a time, on the same answer streams."""
    spec = PolicySpec.parse("blend")
    wrong = 0
    for seed in range(reps):
        draws = AnswerDraws(StreamEngine(records, seed, LATENCY).dataset, seed)
        start = 0
        for chunk in split(records, size):
            # Built as a job builds it, so that ties are broken alike.
            policy = spec.build(len(chunk), b * len(chunk), seed=seed, max_in_flight=b * len(chunk))
            while chosen := policy.select(1):
                policy.observe(chosen[0], draws.next(start + chosen[0]))
            wrong += sum(policy.votes.answer(q) != 0 for q in range(len(chunk)))
            start += len(chunk)
    return wrong / reps / len(records)


def http_run(
    records: list[Record], size: int, b: int, mean_latency: float, seed: int
) -> dict[str, Any]:
    """One split through a real ``POST /solve`` per job, concurrently, in real time."""
    latency = LatencyModel(fixed=0.0, exponential_mean=mean_latency, max_concurrent_sequences=64)
    server, thread, port = serve(StreamEngine(records, seed, latency), Settings())

    async def solve(chunk: list[Record], client: httpx.AsyncClient, **extra: Any) -> int:
        body = {
            "questions": [{"id": r.id, "prompt": r.id} for r in chunk],
            "answer": {"kind": "exact"},
            **extra,
        }
        reply = (await client.post(f"http://127.0.0.1:{port}/solve", json=body)).json()
        return sum(a["answer"] != r.mode for a, r in zip(reply["answers"], chunk, strict=True))

    async def main(**extra: Any) -> tuple[float, float]:
        async with httpx.AsyncClient(timeout=600) as client:
            start = time.perf_counter()
            wrong = await asyncio.gather(*(solve(c, client, **extra) for c in split(records, size)))
            return sum(wrong) / len(records), time.perf_counter() - start

    try:
        blend_error, blend_s = asyncio.run(main(budget_per_question=b))
        sc_error, sc_s = asyncio.run(main(budget_per_question=TARGET, policy="sc"))
    finally:
        server.should_exit = True
        thread.join()
    return {"blend": (blend_error, blend_s), "sc": (sc_error, sc_s)}


def scheduler_budget(
    records: list[Record], size: int | None, concurrency: int, bar: float, guess: int, reps: int
) -> tuple[int | None, float]:
    """The default scheduler's least budget per question reaching ``bar``; its modelled seconds."""
    runs: dict[int, tuple[float, float]] = {}

    def error(b: int) -> float:
        if b not in runs:
            runs[b] = error_at(records, size, b, reps, concurrency=concurrency)
        return runs[b][0]

    found = least_budget(error, bar, TARGET, guess)
    return found, runs[found or TARGET][1]


def sc_wall(records: list[Record], size: int | None, concurrency: int | None = None) -> float:
    """Modelled seconds of SC@32 sent as ``n=32`` a question, at most ``concurrency`` in flight."""
    return error_at(
        records, size, TARGET, 1, policy=PolicySpec("sc"),
        concurrency=concurrency or len(records) * TARGET, max_samples_per_request=TARGET,
        in_flight_per_question=TARGET,
    )[1]  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("data_dir", type=Path)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--sizes", default="1,4,16,64,all")
    parser.add_argument("--concurrency", default="8,64,256")
    parser.add_argument("--sets", default="", help="comma-separated file stems (default: all)")
    parser.add_argument("--http", action="store_true", help="also one run through POST /solve")
    args = parser.parse_args()
    sizes = [None if s == "all" else int(s) for s in args.sizes.split(",")]
    concurrencies = [int(c) for c in args.concurrency.split(",")]
    paths = sorted(args.data_dir.glob("*.jsonl"))
    if args.sets:
        paths = [p for p in paths if p.stem in args.sets.split(",")]
    print(
        "| data | job size | concurrency | SC@32 error | sequential | scheduler "
        "| of sequential | wall s | SC n=32 wall s | same concurrency |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for path in paths:
        records = load(path)
        sc_error = error_at(records, None, TARGET, args.reps, policy=PolicySpec("sc"))[0]
        for size in sizes:
            seq = least_budget(
                functools.partial(sequential_error, records, size, reps=args.reps), sc_error, TARGET
            )
            sc_s = sc_wall(records, size)
            for concurrency in concurrencies:
                found, seconds = scheduler_budget(
                    records, size, concurrency, sc_error, seq or TARGET, args.reps
                )
                print(
                    f"| {path.stem} | {size or len(records)} | {concurrency} | {sc_error:.4f} "
                    f"| {_ratio(seq)} | {_ratio(found)} | {_share(seq, found)} "
                    f"| {seconds:.1f} | {sc_s:.1f} | {sc_wall(records, size, concurrency):.1f} |",
                    flush=True,
                )
    if args.http:
        records = load(args.data_dir / "esc_lastletters_gpt35.jsonl")
        for seed in range(3):
            result = http_run(records, 16, 8, 0.05, seed)
            for name, (error, seconds) in result.items():
                print(f"HTTP /solve, esc_lastletters, 16-question jobs, seed {seed}, {name}: "
                      f"error {error:.4f}, {seconds:.1f} s")  # fmt: skip


def _ratio(b: int | None) -> str:
    return "n/r" if b is None else f"{b} ({TARGET / b:.1f}x)"


def _share(seq: int | None, found: int | None) -> str:
    if seq is None:
        return "-" if found is None else "above"
    return "n/r" if found is None else f"{seq / found:.0%}"


if __name__ == "__main__":
    main()
