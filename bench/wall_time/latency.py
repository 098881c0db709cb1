"""Wall time in waves: jobs on the replay engine's wave model, against SC@32 sent as ``n=32``.

The replay engine runs the wave latency model: every request takes one
modelled second whatever its ``n`` (plus, with ``--per-token``, that many
seconds per token of its longest sample) and holds ``n`` of the engine's
``C`` sequences (``--capacity``), so the modelled seconds are waves. A
sample's length is its recorded ``tokens`` where the data is a recording with
lengths (each answer drawn comes with one of its recorded samples); elsewhere
(synthetic sets, older ``answers`` data) it is drawn from the log-normal
:data:`LENGTH` fitted to the embedded model's GSM8K answers, or under
``--profile`` from ``--lengths``. Sets: synthetic families and, given a data
folder, the recorded sets; jobs of ``--sizes`` questions through the real
:class:`~blendserve.scheduler.Job` on a virtual clock. SC@32 is every
question's ``n=32`` request sent at once on the same engine and voted.

Two tables. **Idle**: each job alone on the engine. For the default (waves,
``max_rounds`` 4) and the sample-by-sample default (``max_rounds=0``) we
search the least budget per question (in half samples) whose error, over
``--reps`` seeds, reaches SC@32's, and report there the samples and tokens
per question, the waves of a job (mean) and its rounds per question (p50/p95:
the distinct times its requests started). **Load** (``--load``): every job
of a set at once on one engine (the engine full), the modelled seconds until
the last answer, the tokens saved per question (samples in flight cut when
their question settled, at the run's mean length), and the throughput
(questions a second) against SC@32's. ``--copies K`` puts each question in
K times under new ids: K times the jobs at once, so that they keep the engine
full for longer than its last questions take to drain. The bar a budget must
reach is SC@32's error on the same seeds (``--bar seeds``: the same answers
drawn for both, a handful of questions on a peaked set) or its expected error
(``--bar expected``: every question's 32 answers drawn 200 times over, as the
simulator draws them).
**HTTP** (``--http``): the same jobs through a real ``POST /solve`` on a
loopback server over the same engine, in real time (a wave lasts
``--wave-seconds``), at the budget the idle search found, against SC@32 sent
through ``/solve`` as ``policy: sc`` with 32 samples of a question in one
request: what a caller waits for, scheduler and HTTP included. ``--http --load``:
the load table's jobs, all at once through one server, against SC@32 sent the same way.

``--profile NAME`` (``--lengths cot|reasoning`` for samples recorded without
lengths) replaces the wave model by the replay engine's continuous batching,
each decode step priced by the profile (``qwen2.5-7b-h100``: the H100 fit
shipped with the package), each sample lasting its tokens and handed to the
job as it ends: seconds are modelled seconds, and over HTTP
``--wave-seconds`` is the real seconds of a modelled one.

**Whole requests** (``--whole-requests``, with ``--profile``): the idle search
as above, then its budget on the same continuous batch handing a request's
samples over together once its last ends (an upstream asked for ``n`` without
streaming; the engine's ``delivers_each`` is then False, so that a job plans
no wider waves): what the default errs, spends and waits for there, against
SC@32.

Usage: python -m bench.wall_time.latency [DATA_DIR] [--capacity 256 1024] [--sizes 64]
    [--reps 3] [--synthetic llm,flat,many,ties,mixed,d1,d2] [--jobs 4] [--load]
    [--copies 1] [--per-token 0] [--http] [--wave-seconds 0.5] [--profile NAME] [--lengths cot]
    [--bar seeds|expected] [--whole-requests]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import statistics
import time
from collections import Counter
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from blendserve.answers import make_keyer
from blendserve.engines.base import GenerateRequest, Sample
from blendserve.engines.replay import LENGTHS, LatencyModel
from blendserve.engines.step_cost import load_step_cost
from blendserve.scheduler import AnswerEvent, DoneEvent, Job, JobSpec, Question
from blendserve.service import Settings
from blendserve.sim.clock import run_virtual
from blendserve.sim.data import Dataset
from blendserve.sim.runner import run_sc

from bench.records import Record, StreamEngine, load, percentiles, question_key, synthetic_records
from bench.service import serve

TARGET = 32
NAN = float("nan")
STEP = 0.5
#: Log-normal ``(mu, sigma)`` of completion tokens, fitted to the embedded model's answers
#: to GSM8K questions (the first 12 of tests/fixtures/gsm8k_test_200.jsonl, 2 samples each
#: at temperature 0.8, max_tokens 512: mean 277 tokens, 164 to 497, none cut).
LENGTH = (5.58, 0.30)


@dataclass(frozen=True)
class Run:
    """One method at one budget, over every job and seed."""

    error: float
    samples: float  # per question
    tokens: float  # completion tokens per question
    saved: float  # per question, tokens of samples cut in flight when their question settled
    seconds: float  # per job (idle) or per set (load), mean
    rounds: tuple[float, float]  # per question, p50 and p95


class _WaveEngine(StreamEngine):
    """The answer streams under the wave latency model, keeping when each question's requests
    started: requests of one wave (a wave split at ``max_samples_per_request``) start together.
    ``whole``: a request's samples are handed over together, once its last ends."""

    def __init__(
        self,
        records: list[Record],
        seed: int,
        capacity: int,
        per_token: float,
        wave: float = 1.0,
        profile: str | None = None,
        lengths: str = "cot",
        whole: bool = False,
    ) -> None:
        # ``wave``: real seconds a modelled one (a wave, or under a profile a second).
        if profile is None:
            latency = LatencyModel(
                fixed=wave, per_token=per_token, max_concurrent_sequences=capacity, length=LENGTH
            )
        else:
            latency = LatencyModel(
                max_concurrent_sequences=capacity,
                length=LENGTHS[lengths],
                step_cost=load_step_cost(profile),
                time_scale=wave,
            )
        super().__init__(records, seed, latency)
        self.whole = whole
        self.delivers_each = self.delivers_each and not whole
        self.starts: dict[str, set[float]] = {}

    async def replay_stream(self, request: GenerateRequest, kind: str) -> AsyncIterator[Sample]:
        now = asyncio.get_running_loop().time()
        self.starts.setdefault(question_key(request), set()).add(now)
        samples = super().replay_stream(request, kind)
        async with contextlib.aclosing(samples):
            if self.whole:
                ended = [sample async for sample in samples]
                for sample in ended:
                    yield sample
            else:
                async for sample in samples:
                    yield sample


async def _job(
    records: list[Record], engine: _WaveEngine, **spec: Any
) -> tuple[int, int, int, int]:
    """(wrong answers, samples, completion tokens, samples cut when settled) of one job."""
    questions = [Question(id=r.id, prompt=r.id) for r in records]
    keyer = make_keyer("exact", None)
    job = Job(JobSpec(questions=questions, **spec), engine.rendering("exact"), keyer)
    wrong = spent = tokens = cut = 0
    async for event in job.events():
        if isinstance(event, AnswerEvent):
            wrong += event.answer != records[event.index].mode
        elif isinstance(event, DoneEvent):
            spent, tokens, cut = event.spent, event.usage.completion_tokens, event.cut
    return wrong, spent, tokens, cut


def _leader(samples: list[Sample]) -> str | None:
    """The plurality answer, ties to the first to reach the top count (as the vote state)."""
    top = max(Counter(s.text for s in samples).values())
    seen: Counter[str] = Counter()
    for sample in samples:
        seen[sample.text] += 1
        if seen[sample.text] == top:
            return sample.text
    return None


async def _sc(records: list[Record], engine: _WaveEngine) -> tuple[int, int, int, int]:
    """SC@32: each question's ``n=32`` request, all at once."""
    spec = JobSpec(questions=[Question("0")], budget=1)
    view = engine.rendering("exact")
    replies = await asyncio.gather(
        *(view.generate(Question(id=r.id, prompt=r.id).request(TARGET, 0, spec)) for r in records)
    )
    wrong = sum(_leader(s) != r.mode for r, s in zip(records, replies, strict=True))
    tokens = sum(s.completion_tokens for samples in replies for s in samples)
    return wrong, TARGET * len(records), tokens, 0


async def _run(
    group: list[Record],
    chunks: list[list[Record]],
    engine: _WaveEngine,
    b: float | None,
    seed: int,
    spec: dict[str, Any],
) -> list[tuple[int, int, int, int]]:
    """SC@32 over ``group`` (``b`` None), else one job per chunk at ``b`` a question, at once."""
    if b is None:
        return [await _sc(group, engine)]
    jobs = (
        _job(c, engine, budget=max(len(c), round(b * len(c))), seed=seed, **spec) for c in chunks
    )
    return list(await asyncio.gather(*jobs))


def measure(
    jobs: list[list[Record]],
    capacity: int,
    reps: int,
    b: float | None,
    *,
    together: bool = False,
    per_token: float = 0.0,
    profile: str | None = None,
    lengths: str = "cot",
    whole: bool = False,
    **spec: Any,
) -> Run:
    """Every job alone on a fresh engine (``together``: all at once on one), ``reps`` seeds;
    ``b`` None: SC@32; ``whole``: the engine hands a request's samples over together."""
    wrong = spent = tokens = saved = 0.0
    seconds: list[float] = []
    rounds: list[int] = []
    groups = [[r for job in jobs for r in job]] if together else jobs
    for seed in range(reps):
        for group in groups:
            engine = _WaveEngine(
                group, seed, capacity, per_token, profile=profile, lengths=lengths, whole=whole
            )
            chunks = jobs if together else [group]
            results, elapsed = run_virtual(_run(group, chunks, engine, b, seed, spec))
            wrong += sum(r[0] for r in results)
            spent += sum(r[1] for r in results)
            tokens += sum(r[2] for r in results)
            # A cut sample would have been as long as the samples the same run completed.
            saved += (
                sum(r[3] for r in results)
                * sum(r[2] for r in results)
                / max(1, sum(r[1] for r in results))
            )
            seconds.append(elapsed)
            rounds += [len(engine.starts.get(r.id, ())) for r in group]
    n = reps * sum(len(j) for j in jobs)
    p50, p95 = percentiles(rounds)
    return Run(wrong / n, spent / n, tokens / n, saved / n, statistics.fmean(seconds), (p50, p95))


def over_http(
    jobs: list[list[Record]],
    capacity: int,
    reps: int,
    b: float | None,
    wave: float,
    profile: str | None = None,
    lengths: str = "cot",
    together: bool = False,
) -> Run:
    """Each job through a real ``POST /solve`` on a fresh loopback server, in real time
    (``wave`` real seconds a modelled one; ``together``: every job at once on one server and
    engine, until the last answer); ``b`` None: SC@32 (``policy: sc``, a question's 32
    samples in one request)."""
    if b is None:
        options: dict[str, Any] = {
            "policy": "sc", "budget_per_question": TARGET,
            "in_flight_per_question": TARGET, "concurrency": 4096,
        }  # fmt: skip
    else:
        options = {"budget_per_question": b}
    wrong = spent = tokens = 0
    waves: list[float] = []
    groups = [jobs] if together else [[job] for job in jobs]
    for seed in range(reps):
        for group in groups:
            records = [r for job in group for r in job]
            engine = _WaveEngine(records, seed, capacity, 0.0, wave, profile, lengths)
            server, thread, port = serve(engine, Settings(default_concurrency=capacity))

            def solve(job: list[Record], port: int = port) -> dict[str, Any]:
                body = {
                    "questions": [{"id": r.id, "prompt": r.id} for r in job],
                    "answer": {"kind": "exact"},
                    **options,
                }
                reply = httpx.post(f"http://127.0.0.1:{port}/solve", json=body, timeout=3600)
                result: dict[str, Any] = reply.raise_for_status().json()
                return result

            try:
                start = time.perf_counter()
                with ThreadPoolExecutor(len(group)) as pool:
                    results = list(pool.map(solve, group))
                waves.append((time.perf_counter() - start) / wave)
            finally:
                server.should_exit = True
                thread.join()
            for job, result in zip(group, results, strict=True):
                answers = result["answers"]
                wrong += sum(a["answer"] != r.mode for a, r in zip(answers, job, strict=True))
                spent += result["budget"]["spent"]
                tokens += result["usage"]["completion_tokens"]
    n = reps * sum(len(j) for j in jobs)
    return Run(wrong / n, spent / n, tokens / n, 0.0, statistics.fmean(waves), (0.0, 0.0))


def least(
    jobs: list[list[Record]], capacity: int, reps: int, bar: float, **options: Any
) -> tuple[float | None, Run]:
    """The least budget per question (in steps of ``STEP``) whose error is at most ``bar``:
    found in steps of 4 ``STEP``, then walked back."""
    b = 2.0
    run = measure(jobs, capacity, reps, b, **options)
    while run.error > bar and b < TARGET:
        b = min(TARGET, b + 4 * STEP)
        run = measure(jobs, capacity, reps, b, **options)
    if run.error > bar:
        return None, run
    while b - STEP >= 2.0:
        lower = measure(jobs, capacity, reps, b - STEP, **options)
        if lower.error > bar:
            break
        b, run = b - STEP, lower
    return b, run


def sets(data: Path | None, families: list[str]) -> dict[str, list[Record]]:
    """The synthetic families asked for, then the recorded sets of ``data``."""
    out = {f"synthetic {f}": synthetic_records(f, 640, seed=1) for f in families}
    if data is not None:
        for path in sorted(data.glob("*.jsonl")):
            out[path.stem] = load(path)
    return out


def _cell(b: float | None, run: Run) -> str:
    reached = "" if b else " (not reached)"
    return f"{run.samples:.1f}{reached}, {run.tokens:.0f}, {run.error:.4f}"


def idle_rows(name: str, records: list[Record], size: int, args: argparse.Namespace) -> None:
    """One row per capacity: each job alone on an idle engine."""
    jobs = [records[i : i + size] for i in range(0, len(records) - size + 1, size)]
    jobs = jobs[: args.jobs]
    for capacity in args.capacity:
        options = {"per_token": args.per_token, "profile": args.profile, "lengths": args.lengths}
        sc = measure(jobs, capacity, args.reps, None, **options)
        b, waves = least(jobs, capacity, args.reps, sc.error, **options)
        if args.profile:  # sample by sample takes dozens of tails: not worth the search
            b0, fine = None, Run(NAN, NAN, NAN, NAN, NAN, (NAN, NAN))
        else:
            b0, fine = least(jobs, capacity, args.reps, sc.error, max_rounds=0, **options)
        print(
            f"| {name} | {size} | {capacity} | {sc.tokens:.0f}, {sc.error:.4f}, {sc.seconds:.1f} "
            f"| {_cell(b, waves)}, {waves.seconds:.1f}, "
            f"{waves.rounds[0]:.0f}/{waves.rounds[1]:.0f} "
            f"| {_cell(b0, fine)}, {fine.seconds:.1f} |",
            flush=True,
        )


def whole_rows(name: str, records: list[Record], size: int, args: argparse.Namespace) -> None:
    """One row per capacity: the idle search's budget (each sample handed over as it ends),
    then the default at that budget where a request's samples come together."""
    jobs = [records[i : i + size] for i in range(0, len(records) - size + 1, size)]
    jobs = jobs[: args.jobs]
    model = {"profile": args.profile, "lengths": args.lengths}
    for capacity in args.capacity:
        sc = measure(jobs, capacity, args.reps, None, **model)
        b, each = least(jobs, capacity, args.reps, sc.error, **model)
        whole = measure(jobs, capacity, args.reps, b or TARGET, whole=True, **model)
        print(
            f"| {name} | {size} | {capacity} | {sc.tokens:.0f}, {sc.error:.4f}, {sc.seconds:.1f} "
            f"| {b or TARGET} | {_cell(b, each)}, {each.seconds:.1f}, "
            f"{each.rounds[0]:.0f}/{each.rounds[1]:.0f} "
            f"| {whole.samples:.1f}, {whole.tokens:.0f}, {whole.error:.4f}, {whole.seconds:.1f}, "
            f"{whole.rounds[0]:.0f}/{whole.rounds[1]:.0f} |",
            flush=True,
        )


def expected_sc_error(records: list[Record], draws: int = 200) -> float:
    """SC@32's expected error on ``records``: each question's 32 answers drawn ``draws``
    times over, from seeds apart from those the runs use."""
    dataset = Dataset("bar", [r.id for r in records], [r.probs for r in records])
    wrong = sum(int(run_sc(dataset, TARGET, 1_000_000 + d)[-1]) for d in range(draws))
    return wrong / (draws * len(records))


def copies(records: list[Record], k: int) -> list[Record]:
    """``records`` ``k`` times over, each copy under ids of its own (``#1``, ``#2``, ...)."""
    if k == 1:
        return records
    return [Record(f"{r.id}#{i}", r.answers, r.probs, r.samples) for i in range(k) for r in records]


def load_rows(name: str, records: list[Record], size: int, args: argparse.Namespace) -> None:
    """One row per capacity: every job of the set (``--copies`` times over) at once."""
    expected = expected_sc_error(records) if args.bar == "expected" else None
    records = copies(records, args.copies)
    jobs = [records[i : i + size] for i in range(0, len(records), size)]
    for capacity in args.capacity:
        options = {
            "per_token": args.per_token, "profile": args.profile, "lengths": args.lengths,
            "together": True,
        }  # fmt: skip
        sc = measure(jobs, capacity, args.reps, None, **options)
        bar = sc.error if expected is None else expected
        b, run = least(jobs, capacity, args.reps, bar, **options)
        speedup = sc.seconds / run.seconds
        print(
            f"| {name} | {len(records)} | {capacity} | {bar:.4f}, {sc.seconds:.0f} "
            f"| {_cell(b, run)}, {run.seconds:.0f} | {run.saved:.0f} | {speedup:.1f}x |",
            flush=True,
        )


def http_rows(name: str, records: list[Record], size: int, args: argparse.Namespace) -> None:
    """One row per capacity: the idle search's budget, then both methods through HTTP."""
    jobs = [records[i : i + size] for i in range(0, len(records) - size + 1, size)]
    jobs = jobs[: args.jobs]
    model = {"profile": args.profile, "lengths": args.lengths}
    for capacity in args.capacity:
        bar = measure(jobs, capacity, args.reps, None, **model).error
        b, _ = least(jobs, capacity, args.reps, bar, **model)
        sc = over_http(jobs, capacity, args.reps, None, args.wave_seconds, **model)
        run = over_http(jobs, capacity, args.reps, b or TARGET, args.wave_seconds, **model)
        print(
            f"| {name} | {size} | {capacity} | {sc.error:.4f}, {sc.tokens:.0f}, {sc.seconds:.1f} "
            f"| {b or TARGET} | {run.samples:.1f}, {run.tokens:.0f}, {run.error:.4f}, "
            f"{run.seconds:.1f} | {run.tokens / sc.tokens:.2f}x "
            f"| {run.seconds / sc.seconds:.2f}x |",
            flush=True,
        )


def http_load_rows(name: str, records: list[Record], size: int, args: argparse.Namespace) -> None:
    """One row per capacity: the load search's budget, then every job of the set at once
    through HTTP, against SC@32 sent the same way."""
    jobs = [records[i : i + size] for i in range(0, len(records), size)]
    model = {"profile": args.profile, "lengths": args.lengths}
    for capacity in args.capacity:
        bar = measure(jobs, capacity, args.reps, None, together=True, **model).error
        b, _ = least(jobs, capacity, args.reps, bar, together=True, **model)
        sc = over_http(jobs, capacity, args.reps, None, args.wave_seconds, **model, together=True)
        run = over_http(
            jobs, capacity, args.reps, b or TARGET, args.wave_seconds, **model, together=True
        )
        print(
            f"| {name} | {len(records)} | {capacity} | {sc.error:.4f}, {sc.tokens:.0f}, "
            f"{sc.seconds:.0f} | {b or TARGET} | {run.samples:.1f}, {run.tokens:.0f}, "
            f"{run.error:.4f}, {run.seconds:.0f} | {sc.seconds / run.seconds:.1f}x |",
            flush=True,
        )


#: Each table's header and rows.
TABLES = {
    "idle": (
        "| set | Q | C | SC@32: tokens/q, error, waves | default: samples/q, tokens/q, error, "
        "waves, rounds p50/p95 | sample by sample: samples/q, tokens/q, error, waves |",
        idle_rows,
    ),
    "load": (
        "| set | Q | C | SC@32: error, seconds | default: samples/q, tokens/q, error, "
        "seconds | tokens saved/q | throughput vs SC@32 |",
        load_rows,
    ),
    "whole": (
        "| set | Q | C | SC@32: tokens/q, error, seconds | budget/q | each sample as it ends: "
        "samples/q, tokens/q, error, seconds, rounds p50/p95 | whole requests at that budget: "
        "samples/q, tokens/q, error, seconds, rounds p50/p95 |",
        whole_rows,
    ),
    "http-load": (
        "| set | Q | C | SC@32: error, tokens/q, seconds | budget/q | default: samples/q, "
        "tokens/q, error, seconds | throughput vs SC@32 |",
        http_load_rows,
    ),
    "http": (
        "| set | Q | C | SC@32: error, tokens/q, waves | budget/q | default: samples/q, "
        "tokens/q, error, waves | tokens vs SC@32 | waves vs SC@32 |",
        http_rows,
    ),
}


def main() -> None:
    """Prints the idle table (or with ``--load`` the load table, with ``--http`` the HTTP one,
    with ``--whole-requests`` the whole requests one)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "data", type=Path, nargs="?",
        help="folder of recorded sets (*.jsonl): recordings, whose samples last their recorded "
        "tokens where they have them, or older answers",
    )  # fmt: skip
    parser.add_argument("--capacity", type=int, nargs="+", default=[256, 1024])
    parser.add_argument("--sizes", type=int, nargs="+", default=[64])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--jobs", type=int, default=4, help="idle: jobs per set and size, at most")
    parser.add_argument("--synthetic", default="llm,flat,many,ties,mixed,d1,d2")
    parser.add_argument("--load", action="store_true", help="the load table instead")
    parser.add_argument(
        "--copies", type=int, default=1, help="load: each question this many times, new ids"
    )
    parser.add_argument(
        "--per-token", type=float, default=0.0,
        help="modelled seconds a token (recorded tokens where the data has them, else drawn)",
    )  # fmt: skip
    parser.add_argument("--http", action="store_true", help="the HTTP table instead")
    parser.add_argument("--profile", help="a decode-step profile: continuous batching, seconds")
    parser.add_argument(
        "--lengths", default="cot", choices=["cot", "reasoning"],
        help="with --profile: the lengths drawn for samples without recorded tokens (synthetic "
        "sets, older answers data); a recording's own lengths are used where it has them",
    )  # fmt: skip
    parser.add_argument(
        "--bar", default="seeds", choices=["seeds", "expected"],
        help="load: SC@32's error on the same seeds, or its expected error",
    )  # fmt: skip
    parser.add_argument(
        "--wave-seconds", type=float, default=0.5, help="HTTP: real seconds a modelled one"
    )
    parser.add_argument(
        "--whole-requests", action="store_true",
        help="with --profile: the idle search's budget where a request's samples come together",
    )  # fmt: skip
    args = parser.parse_args()
    if args.whole_requests and not args.profile:
        parser.error("--whole-requests needs --profile (the wave model's come together anyway)")
    families = [f for f in args.synthetic.split(",") if f]
    table = "load" if args.load else "idle"
    if args.http:
        table = "http-load" if args.load else "http"
    elif args.whole_requests:
        table = "whole"
    header, rows = TABLES[table]
    if args.profile:
        header = header.replace("waves", "seconds")
    columns = header.count("|") - 1
    print(header)
    print("|---" * columns + "|")
    for name, records in sets(args.data, families).items():
        for size in args.sizes:
            rows(name, records, size, args)


if __name__ == "__main__":
    main()
