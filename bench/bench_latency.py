"""Wall time in waves: one job alone on an idle engine, against SC@32 sent as ``n=32`` in one wave.

The replay engine runs the wave latency model: every request takes one
modelled second whatever its ``n`` and holds ``n`` of the engine's ``C``
sequences (``--capacity``), so the modelled seconds are waves. For each set
(synthetic families and, given a data folder, the recorded sets), jobs of
``--sizes`` questions run one at a time through the real
:class:`~blendserve.scheduler.Job` on a virtual clock. SC@32 is every
question's ``n=32`` request sent at once on the same engine and voted. For
the default (waves, ``max_rounds`` 4) and today's sample-by-sample default
(``max_rounds=0``) we search the least budget per question (in half samples)
whose error, over ``--reps`` seeds, reaches SC@32's, and report there: the
samples per question, the waves of a job (mean), and its rounds per question
(p50/p95: the distinct times its requests started).

Usage: python bench/bench_latency.py [DATA_DIR] [--capacity 256 1024] [--sizes 64]
    [--reps 3] [--synthetic llm,flat,many,ties,mixed,d1,d2] [--jobs 4]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from blendserve.answers import make_keyer
from blendserve.engines.base import GenerateRequest, Sample
from blendserve.engines.replay import LatencyModel
from blendserve.scheduler import AnswerEvent, DoneEvent, Job, JobSpec, Question
from blendserve.sim.clock import run_virtual
from records import Record, StreamEngine, load, percentiles, question_key, synthetic_records

TARGET = 32
STEP = 0.5


@dataclass(frozen=True)
class Run:
    """One method at one budget, over every job and seed."""

    error: float
    samples: float  # per question
    waves: float  # per job, mean
    rounds: tuple[float, float]  # per question, p50 and p95


class _WaveEngine(StreamEngine):
    """The answer streams under the wave latency model, keeping when each question's requests
    started: requests of one wave (a wave split at ``max_samples_per_request``) start together."""

    def __init__(self, records: list[Record], seed: int, capacity: int) -> None:
        super().__init__(records, seed, LatencyModel(fixed=1.0, max_concurrent_sequences=capacity))
        self.starts: dict[str, set[float]] = {}

    async def replay(self, request: GenerateRequest, kind: str) -> list[Sample]:
        now = asyncio.get_running_loop().time()
        self.starts.setdefault(question_key(request), set()).add(now)
        return await super().replay(request, kind)


async def _job(records: list[Record], engine: _WaveEngine, **spec: Any) -> tuple[int, int]:
    questions = [Question(id=r.id, prompt=r.id) for r in records]
    job = Job(
        JobSpec(questions=questions, **spec), engine.rendering("exact"), make_keyer("exact", None)
    )
    wrong = spent = 0
    async for event in job.events():
        if isinstance(event, AnswerEvent):
            wrong += event.answer != records[event.index].mode
        elif isinstance(event, DoneEvent):
            spent = event.spent
    return wrong, spent


async def _sc(records: list[Record], engine: _WaveEngine) -> tuple[int, int]:
    spec = JobSpec(questions=[Question("0")], budget=1)
    view = engine.rendering("exact")
    replies = await asyncio.gather(
        *(view.generate(Question(id=r.id, prompt=r.id).request(TARGET, 0, spec)) for r in records)
    )
    wrong = 0
    for record, samples in zip(records, replies, strict=True):
        counts = Counter(s.text for s in samples)
        top = max(counts.values())
        # the first answer to reach the top count leads, as the vote state has it
        seen: Counter[str] = Counter()
        leader = None
        for sample in samples:
            seen[sample.text] += 1
            if seen[sample.text] == top:
                leader = sample.text
                break
        wrong += leader != record.mode
    return wrong, TARGET * len(records)


def measure(
    jobs: list[list[Record]], capacity: int, reps: int, b: float | None, **spec: Any
) -> Run:
    """Every job alone on a fresh engine, ``reps`` seeds; ``b`` None: SC@32."""
    wrong = spent = 0
    waves: list[float] = []
    rounds: list[int] = []
    for seed in range(reps):
        for records in jobs:
            engine = _WaveEngine(records, seed, capacity)
            if b is None:
                (w, s), seconds = run_virtual(_sc(records, engine))
            else:
                budget = max(len(records), round(b * len(records)))
                (w, s), seconds = run_virtual(
                    _job(records, engine, budget=budget, seed=seed, **spec)
                )
            wrong += w
            spent += s
            waves.append(seconds)
            rounds += [len(engine.starts.get(r.id, ())) for r in records]
    n = reps * sum(len(j) for j in jobs)
    p50, p95 = percentiles(rounds)
    return Run(wrong / n, spent / n, statistics.fmean(waves), (p50, p95))


def least(
    jobs: list[list[Record]], capacity: int, reps: int, bar: float, **spec: Any
) -> tuple[float | None, Run]:
    """The least budget per question (in steps of ``STEP``) whose error is at most ``bar``."""
    b = 2.0
    run = measure(jobs, capacity, reps, b, **spec)
    while run.error > bar and b < TARGET:
        b += STEP
        run = measure(jobs, capacity, reps, b, **spec)
    return (b if run.error <= bar else None), run


def sets(data: Path | None, families: list[str]) -> dict[str, list[Record]]:
    """The synthetic families asked for, then the recorded sets of ``data``."""
    out = {f"synthetic {f}": synthetic_records(f, 640, seed=1) for f in families}
    if data is not None:
        for path in sorted(data.glob("*.jsonl")):
            out[path.stem] = load(path)
    return out


def main() -> None:
    """Prints one table row per set, size and capacity."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("data", type=Path, nargs="?", help="folder of recorded sets (*.jsonl)")
    parser.add_argument("--capacity", type=int, nargs="+", default=[256, 1024])
    parser.add_argument("--sizes", type=int, nargs="+", default=[64])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--jobs", type=int, default=4, help="jobs per set and size, at most")
    parser.add_argument("--synthetic", default="llm,flat,many,ties,mixed,d1,d2")
    args = parser.parse_args()
    families = [f for f in args.synthetic.split(",") if f]
    print(
        "| set | Q | C | SC@32 error, waves | default: samples/q, error, waves, "
        "rounds p50/p95 | sample by sample: samples/q, waves |"
    )
    print("|---|---|---|---|---|---|")
    for name, records in sets(args.data, families).items():
        for size in args.sizes:
            jobs = [records[i : i + size] for i in range(0, len(records) - size + 1, size)][
                : args.jobs
            ]
            for capacity in args.capacity:
                sc = measure(jobs, capacity, args.reps, None)
                b, waves = least(jobs, capacity, args.reps, sc.error)
                b0, fine = least(jobs, capacity, args.reps, sc.error, max_rounds=0)
                row = (
                    f"| {name} | {size} | {capacity} | {sc.error:.4f}, {sc.waves:.1f} "
                    f"| {waves.samples:.1f}{'' if b else ' (not reached)'}, {waves.error:.4f}, "
                    f"{waves.waves:.1f}, {waves.rounds[0]:.0f}/{waves.rounds[1]:.0f} "
                    f"| {fine.samples:.1f}{'' if b0 else ' (not reached)'}, {fine.waves:.1f} |"
                )
                print(row, flush=True)


if __name__ == "__main__":
    main()
