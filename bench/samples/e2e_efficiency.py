"""End-to-end sample efficiency: the real scheduler on the replay engine, against SC measured alike.

For each recorded set, the kept questions (as the simulator keeps them), and
for each synthetic family asked for (``--synthetic flat,many,mixed``: the
simulator's distributions, served exactly), are split into jobs of 1, 4, 16,
64 questions and one job of all questions. Each job runs through
:class:`~blendserve.scheduler.Job` with default settings and the default
batch policy (``--policy``; ``--policy blend`` gives Blend-ASC's table) over
a replay engine with exponential per-request latency and a 64-sequence
capacity, at concurrency 8, 64 and 256.

Jobs decide sample by sample (``max_rounds=0``), as the default does on a
busy engine; ``bench/wall_time/latency.py`` measures the waves a job sends on an
engine with room.

The default policy stops a question once it is settled, so a job may spend
less than its budget: every method is charged the mean samples per question
it actually spent. We report the least budget per question with which the
policy's reducible error (averaged over repetitions) reaches SC@32's, SC@32
being measured through the same scheduler, the mean samples it spent there
and ``32 / spent``; next to it, the simulator's sequential figure (the same
policy, one sample at a time, on the same answer streams and job split),
charged alike; the engine requests per question (rounds, p50/p95); and the
modelled wall time of the whole set at that budget against SC@32 sent as
``n=32`` per question (with no limit on samples in flight, and with the
job's concurrency). Runs on a virtual clock, so the modelled latency costs
no real time and the numbers do not depend on the machine's load.

``--http`` also runs one configuration (esc_lastletters in 16-question
jobs, 8 samples per question with the server's default policy against
SC@32, the same answer streams, three seeds) through a real
``POST /solve`` on loopback, in real time.

Usage: python -m bench.samples.e2e_efficiency ../shared/data [--reps 5] [--sizes 64]
    [--concurrency 64] [--synthetic flat,many,mixed] [--policy blend] [--http]
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from blendserve.answers import make_keyer
from blendserve.core.policies import PolicySpec
from blendserve.engines.replay import LatencyModel, ReplayEngine
from blendserve.scheduler import AnswerEvent, DoneEvent, Job, JobSpec, Question
from blendserve.service import Settings
from blendserve.sim.clock import run_virtual
from blendserve.sim.runner import AnswerDraws

from bench.records import Record, StreamEngine, load, percentiles, synthetic_records
from bench.service import serve

TARGET = 32
STEPS = 4  # budgets per question are searched in quarter samples
LATENCY = LatencyModel(fixed=0.05, exponential_mean=0.25, max_concurrent_sequences=64)
#: The default batch policy of a job (``hedge`` at the time of writing).
DEFAULT_SPEC: PolicySpec = JobSpec(questions=[Question("0")], budget=1).policy

NAN = float("nan")


@dataclass(frozen=True)
class Point:
    """One method at one budget per question, averaged over repetitions.

    Attributes:
        error: reducible error (answers that are not the true mode).
        spent: mean samples per question actually spent.
        seconds: modelled wall time of the whole set (NaN: not modelled).
        rounds: engine requests per question, p50 and p95 over every
            question of every repetition (NaN: not modelled).
    """

    error: float
    spent: float
    seconds: float = NAN
    rounds: tuple[float, float] = (NAN, NAN)


def split(records: list[Record], size: int | None) -> list[list[Record]]:
    """Consecutive jobs of ``size`` questions (None: one job of all)."""
    size = size or len(records)
    return [records[i : i + size] for i in range(0, len(records), size)]


async def _run_job(job_records: list[Record], engine: ReplayEngine, **spec: Any) -> tuple[int, int]:
    """Runs one job; returns (wrong answers, samples spent)."""
    questions = [Question(id=r.id, prompt=r.id) for r in job_records]
    job = Job(
        JobSpec(questions=questions, **{"max_rounds": 0, **spec}),
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


def job_budget(budget_per_question: float, questions: int) -> int:
    """A job's whole budget: ``budget_per_question`` a question, at least one each."""
    return max(questions, round(budget_per_question * questions))


def run_set(
    records: list[Record], size: int | None, budget_per_question: float, seed: int, **spec: Any
) -> tuple[int, int, float, list[int]]:
    """All jobs of one split at once on one engine.

    Returns:
        (wrong answers, samples spent, modelled seconds, engine requests of each question).
    """
    engine = StreamEngine(records, seed, LATENCY)
    jobs = split(records, size)

    async def main() -> tuple[int, int]:
        results = await asyncio.gather(
            *(
                _run_job(
                    chunk,
                    engine,
                    budget=job_budget(budget_per_question, len(chunk)),
                    seed=seed,
                    **spec,
                )
                for chunk in jobs
            )
        )
        return sum(w for w, _ in results), sum(s for _, s in results)

    (wrong, spent), elapsed = run_virtual(main())
    rounds = [engine.requests_per_question[r.id] for r in records]
    return wrong, spent, elapsed, rounds


def measure(records: list[Record], size: int | None, b: float, reps: int, **spec: Any) -> Point:
    """Error, samples spent, modelled seconds and rounds over ``reps`` seeds."""
    runs = [run_set(records, size, b, seed, **spec) for seed in range(reps)]
    n = len(records) * reps
    p50, p95 = percentiles([r for run in runs for r in run[3]])
    return Point(
        error=sum(run[0] for run in runs) / n,
        spent=sum(run[1] for run in runs) / n,
        seconds=statistics.fmean(run[2] for run in runs),
        rounds=(p50, p95),
    )


def least_budget(
    error: Callable[[int], float], bar: float, limit: int, guess: int = 2
) -> int | None:
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


def search(
    point: Callable[[float], Point], bar: float, guess: float = 2
) -> tuple[float | None, Point]:
    """The least budget per question, in steps of ``1 / STEPS``, reaching ``bar``, and its point
    (at ``TARGET`` when none does)."""
    points: dict[int, Point] = {}

    def error(steps: int) -> float:
        if steps not in points:
            points[steps] = point(steps / STEPS)
        return points[steps].error

    found = least_budget(error, bar, TARGET * STEPS, round(guess * STEPS))
    return (None if found is None else found / STEPS), points[found or TARGET * STEPS]


def sequential(
    records: list[Record], size: int | None, b: float, reps: int, spec: PolicySpec
) -> Point:
    """The simulator's figure: the same policy, one sample at a time, on the same answer streams."""
    wrong, spent = 0, 0
    for seed in range(reps):
        draws = AnswerDraws(StreamEngine(records, seed, LATENCY).dataset, seed)
        start = 0
        for chunk in split(records, size):
            # Built as a job builds it, so that ties are broken alike.
            budget = job_budget(b, len(chunk))
            policy = spec.build(
                len(chunk), budget, seed=seed, settle_delta=0.0, max_in_flight=budget
            )
            while chosen := policy.select(1):
                policy.observe(chosen[0], draws.next(start + chosen[0]))
            wrong += sum(policy.votes.answer(q) != 0 for q in range(len(chunk)))
            spent += policy.num_dispatched
            start += len(chunk)
    n = reps * len(records)
    return Point(error=wrong / n, spent=spent / n)


def http_run(
    records: list[Record], size: int, b: int, mean_latency: float, seed: int
) -> dict[str, tuple[float, float, float]]:
    """One split through a real ``POST /solve`` per job, concurrently, in real time.

    Returns, for the server's default policy at ``b`` and for SC@32:
    (error, mean samples spent per question, seconds).
    """
    latency = LatencyModel(fixed=0.0, exponential_mean=mean_latency, max_concurrent_sequences=64)
    server, thread, port = serve(StreamEngine(records, seed, latency), Settings())

    async def solve(
        chunk: list[Record], client: httpx.AsyncClient, **extra: Any
    ) -> tuple[int, int]:
        body = {
            "questions": [{"id": r.id, "prompt": r.id} for r in chunk],
            "answer": {"kind": "exact"},
            **extra,
        }
        reply = (await client.post(f"http://127.0.0.1:{port}/solve", json=body)).json()
        wrong = sum(a["answer"] != r.mode for a, r in zip(reply["answers"], chunk, strict=True))
        return wrong, reply["budget"]["spent"]

    async def main(**extra: Any) -> tuple[float, float, float]:
        async with httpx.AsyncClient(timeout=600) as client:
            start = time.perf_counter()
            results = await asyncio.gather(
                *(solve(c, client, **extra) for c in split(records, size))
            )
            seconds = time.perf_counter() - start
        n = len(records)
        return sum(w for w, _ in results) / n, sum(s for _, s in results) / n, seconds

    try:
        default = asyncio.run(main(budget_per_question=b))  # the server's default policy
        sc = asyncio.run(main(budget_per_question=TARGET, policy="sc"))
    finally:
        server.should_exit = True
        thread.join()
    return {"default": default, "sc": sc}


def sc_wall(records: list[Record], size: int | None, concurrency: int | None = None) -> float:
    """Modelled seconds of SC@32 sent as ``n=32`` a question, at most ``concurrency`` in flight."""
    return measure(
        records, size, TARGET, 1, policy=PolicySpec("sc"),
        concurrency=concurrency or len(records) * TARGET, max_samples_per_request=TARGET,
        in_flight_per_question=TARGET,
    ).seconds  # fmt: skip


def question_sets(args: argparse.Namespace) -> list[tuple[str, list[Record]]]:
    """The recorded sets of ``--sets`` and the synthetic families of ``--synthetic``, named."""
    sets = []
    if args.sets != "none":
        paths = sorted(args.data_dir.glob("*.jsonl"))
        if args.sets:
            paths = [p for p in paths if p.stem in args.sets.split(",")]
        sets += [(p.stem, load(p)) for p in paths]
    for family in filter(None, args.synthetic.split(",")):
        records = synthetic_records(family, args.synthetic_questions, args.synthetic_seed)
        sets.append((f"synthetic {family}", records))
    return sets


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("data_dir", type=Path, nargs="?", default=Path("../shared/data"))
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--sizes", default="1,4,16,64,all")
    parser.add_argument("--concurrency", default="8,64,256")
    parser.add_argument(
        "--sets", default="", help="comma-separated file stems (default: all; none: no recorded)"
    )
    parser.add_argument(
        "--synthetic", default="", help="comma-separated synthetic families (flat,many,mixed,...)"
    )
    parser.add_argument("--synthetic-questions", type=int, default=300)
    parser.add_argument("--synthetic-seed", type=int, default=0)
    parser.add_argument(
        "--policy",
        default=DEFAULT_SPEC.label,
        help=f"the jobs' batch policy (default: the service's, {DEFAULT_SPEC.label})",
    )
    parser.add_argument("--http", action="store_true", help="also one run through POST /solve")
    args = parser.parse_args()
    spec = PolicySpec.parse(args.policy)
    sizes = [None if s == "all" else int(s) for s in args.sizes.split(",")]
    concurrencies = [int(c) for c in args.concurrency.split(",")]
    print(f"policy {spec.label}; {args.reps} reps; budgets per question, spent/q (32 / spent)")
    print(
        "| data | job size | concurrency | SC@32 error | sequential budget | sequential spent/q "
        "| scheduler budget | error | spent/q | of sequential | rounds/q p50/p95 | wall s "
        "| SC n=32 wall s | same concurrency |"
    )
    print("|" + "---|" * 14)
    for name, records in question_sets(args):
        sc_error = measure(records, None, TARGET, args.reps, policy=PolicySpec("sc")).error
        for size in sizes:
            seq_b, seq = search(
                functools.partial(sequential, records, size, reps=args.reps, spec=spec), sc_error
            )
            sc_s = sc_wall(records, size)
            for concurrency in concurrencies:
                found, point = search(
                    functools.partial(
                        measure, records, size, reps=args.reps, policy=spec, concurrency=concurrency
                    ),
                    sc_error,
                    seq_b or TARGET,
                )
                print(
                    f"| {name} ({len(records)} q) | {size or len(records)} | {concurrency} "
                    f"| {sc_error:.4f} | {_budget(seq_b)} | {_spent(seq_b, seq)} "
                    f"| {_budget(found)} | {point.error:.4f} | {_spent(found, point)} "
                    f"| {_share(seq_b, seq, found, point)} "
                    f"| {point.rounds[0]:.0f} / {point.rounds[1]:.0f} "
                    f"| {point.seconds:.1f} | {sc_s:.1f} "
                    f"| {sc_wall(records, size, concurrency):.1f} |",
                    flush=True,
                )
    if args.http:
        records = load(args.data_dir / "esc_lastletters_gpt35.jsonl")
        for seed in range(3):
            result = http_run(records, 16, 8, 0.05, seed)
            for method, (error, spent, seconds) in result.items():
                print(f"HTTP /solve, esc_lastletters, 16-question jobs, seed {seed}, {method}: "
                      f"error {error:.4f}, {spent:.2f} samples/q, {seconds:.1f} s")  # fmt: skip


def _budget(b: float | None) -> str:
    return "n/r" if b is None else f"{b:g}"


def _spent(b: float | None, point: Point) -> str:
    """Mean samples spent at the budget found and ``32 / spent``; n/r if none reached the bar."""
    return "n/r" if b is None else f"{point.spent:.2f} ({TARGET / point.spent:.1f}x)"


def _share(seq_b: float | None, seq: Point, found: float | None, point: Point) -> str:
    """The scheduler's efficiency as a share of the sequential policy's (spent against spent)."""
    if seq_b is None:
        return "-" if found is None else "above"
    return "n/r" if found is None else f"{seq.spent / point.spent:.0%}"


if __name__ == "__main__":
    main()
