"""DeepConf's wall time: its online and offline methods run literally against the replay
engine, each decode step priced by the H100 profile, lengths and confidences as recorded.

    python -m bench.traces.deepconf_engine [--sets real,flat-d1,flat-d0,peaked-d1]
        [--budgets 12 16 32] [--reps 2] [--time-scale 0.05] [--clock real|virtual]

:mod:`blendserve.sim.traces` has DeepConf as a simulator baseline (error, samples,
tokens); this gives its modelled seconds, as a deployment of it would run a batch of
questions: every question of the reporting half at once, on one engine of ``--capacity``
sequences batching continuously (the engine the service builds for ``--engine replay``).

- offline, eta 10 and 90: one request of ``n = budget`` traces a question, with
  confidences; the top ``eta`` percent by lowest group vote, each weighing its lowest
  group (:func:`~blendserve.sim.traces.deepconf_kept`).
- online, eta 10 and 90: a task a question: one request of the warm-up traces
  (:func:`~blendserve.sim.traces.deepconf_warmup`), the bar their ``100 - eta``
  percentile (:func:`~blendserve.sim.traces.deepconf_bar`); then one trace (``n = 1``) at
  a time with ``cut_below=bar`` (the engine cuts it there and charges only the tokens
  read), until the confidence-weighted leader's share reaches ``tau`` or the budget is
  spent. The answer: the weighted vote of the warm-up traces at or above the bar and of
  the later traces not cut, as :func:`~blendserve.sim.traces.run_deepconf_online`.
- online in batches (``online8``): the same, the traces after the warm-up sent eight at
  a time (one request of ``n = 8``, or what is left of the budget), the consensus checked
  after each batch, as DeepConf's implementation generates.
- SC@32: 32 traces a question in one request, every answer counting one.

Sets and halves are :mod:`bench.traces.service`'s; DeepConf needs no teaching half, so
only the reporting half runs. A fresh engine for each method and seed, seeded through
``SamplingParams.seed`` (a question's k-th trace carries ``seed + k``). Per method:
error against the recording's gold (no gold: its plurality), traces and completion tokens
a question (a cut trace's up to its cut), traces cut a question, and the modelled seconds
until the last answer: with ``--clock real``, real seconds over ``--time-scale`` (what
:mod:`bench.traces.service` reports, the benchmark's own work included); with ``--clock
virtual``, the clock of an event loop that skips idle waits
(:class:`~blendserve.sim.clock.VirtualClockLoop`), the engine's modelled time alone.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, cast

from blendserve.answers import AnswerKind, acanonical_key, aextract, canonical_key, extract
from blendserve.answers import shutdown as shutdown_keys
from blendserve.core.signals import ConfidenceSpec
from blendserve.core.traces import LOW_CONFIDENCE
from blendserve.engines.base import GenerateRequest, SamplingParams
from blendserve.engines.factory import build_engine
from blendserve.engines.replay import ReplayEngine, render
from blendserve.recordings.format import RecordedQuestion
from blendserve.service import Settings
from blendserve.sim.clock import run_virtual
from blendserve.sim.trace_data import write_recording
from blendserve.sim.traces import deepconf_bar, deepconf_kept, deepconf_warmup, weighted_leader

from bench.traces.service import MAX_TOKENS, answer_format, gold_key, halves

#: The window the recordings' trajectories were read with (64 tokens): a request for
#: traces of at most ``MAX_TOKENS`` scales the default spec to it, so the engine can cut.
SPEC = ConfidenceSpec().scaled(MAX_TOKENS)
TAU = 0.95
BATCH = 8
SC_SAMPLES = 32


@dataclass(frozen=True)
class Trace:
    """One trace as served: its voting key (None: no answer, or cut), its completion
    tokens, its lowest group (as read up to its end or cut) and whether it was cut."""

    key: str | None
    tokens: int
    confidence: float
    cut: bool


@dataclass(frozen=True)
class Outcome:
    """A question answered: its answer key, traces drawn, tokens charged, traces cut."""

    answer: str | None
    samples: int
    tokens: int
    cut: int


class Asker:
    """Requests traces of the questions of one run from one engine."""

    def __init__(self, engine: ReplayEngine, seed: int) -> None:
        self.engine = engine
        self.params = SamplingParams(seed=seed, max_tokens=MAX_TOKENS)

    async def traces(
        self, question: RecordedQuestion, first: int, n: int, bar: float | None = None
    ) -> list[Trace]:
        """``n`` traces of ``question`` in one request, its first the question's
        ``first``-th; cut below ``bar`` (None: none cut); each keyed as the service keys
        answers of the question's format."""
        kind = cast(AnswerKind, answer_format(question))
        request = GenerateRequest(
            prompt=question.prompt or question.id,
            question_id=question.id,
            n=n,
            params=self.params.from_sample(first),
            confidence=SPEC,
            cut_below=bar,
        )
        samples = await self.engine.rendering(kind).generate(request)
        traces = []
        for sample in samples:
            if sample.confidence is None:
                raise RuntimeError(f"{question.id}: a trace came back without its confidence")
            cut = sample.finish_reason == LOW_CONFIDENCE
            answer = None if cut else await aextract(sample.text, kind)
            key = None if answer is None else await acanonical_key(answer, kind)
            traces.append(Trace(key, sample.completion_tokens, sample.confidence.lowest_group, cut))
        return traces


async def sc(asker: Asker, question: RecordedQuestion, budget: int) -> Outcome:
    """SC@``budget``: one request of ``budget`` traces, every answer counting one (a tie to
    the answer that reached the top count first)."""
    traces = await asker.traces(question, 0, budget)
    counts: Counter[str] = Counter()
    leader, top = None, 0
    for trace in traces:
        if trace.key is not None:
            counts[trace.key] += 1
            if counts[trace.key] > top:
                leader, top = trace.key, counts[trace.key]
    return Outcome(leader, budget, sum(t.tokens for t in traces), 0)


async def offline(asker: Asker, question: RecordedQuestion, budget: int, eta: float) -> Outcome:
    """DeepConf offline: ``budget`` traces to their end, the top ``eta`` percent by lowest
    group voting, each weighing its lowest group."""
    traces = await asker.traces(question, 0, budget)
    kept = deepconf_kept([t.confidence for t in traces], eta)
    leader, _ = weighted_leader((traces[i].key, traces[i].confidence) for i in kept)
    return Outcome(leader, budget, sum(t.tokens for t in traces), 0)


async def online(
    asker: Asker, question: RecordedQuestion, budget: int, eta: float, batch: int = 1
) -> Outcome:
    """DeepConf online: the warm-up traces set the bar; then ``batch`` traces a request, cut
    below the bar, until the weighted leader's share reaches ``TAU`` or ``budget`` traces
    were drawn (checked after the warm-up and after each request)."""
    first = deepconf_warmup(budget)
    warm = await asker.traces(question, 0, first)
    bar = deepconf_bar([t.confidence for t in warm], eta)
    votes = [(t.key, t.confidence) for t in warm if t.confidence >= bar]
    tokens = sum(t.tokens for t in warm)
    drawn, cut = first, 0
    while drawn < budget and weighted_leader(votes)[1] < TAU:
        n = min(batch, budget - drawn)
        for trace in await asker.traces(question, drawn, n, bar):
            tokens += trace.tokens
            if trace.cut:
                cut += 1
            else:
                votes.append((trace.key, trace.confidence))
        drawn += n
    return Outcome(weighted_leader(votes)[0], drawn, tokens, cut)


Method = Callable[[Asker, RecordedQuestion], Coroutine[Any, Any, Outcome]]


def methods(budget: int) -> list[tuple[str, Method]]:
    """The DeepConf variants at ``budget`` traces a question, named for the table."""
    out: list[tuple[str, Method]] = []
    for eta in (10.0, 90.0):
        out.append((f"offline eta={eta:g}", partial(offline, budget=budget, eta=eta)))
    for eta in (10.0, 90.0):
        out.append((f"online eta={eta:g}", partial(online, budget=budget, eta=eta)))
    for eta in (10.0, 90.0):
        out.append(
            (f"online{BATCH} eta={eta:g}", partial(online, budget=budget, eta=eta, batch=BATCH))
        )
    return out


async def _timed(
    settings: Settings, questions: Sequence[RecordedQuestion], method: Method, seed: int
) -> tuple[list[Outcome], float]:
    """Every question at once on a fresh engine: the outcomes and the loop seconds until
    the last answer."""
    engine = await build_engine(settings.engine_config())
    if not isinstance(engine, ReplayEngine):
        raise TypeError(f"expected the replay engine, got {type(engine).__name__}")
    asker = Asker(engine, seed)
    loop = asyncio.get_running_loop()
    start = loop.time()
    outcomes = await asyncio.gather(*(method(asker, q) for q in questions))
    return list(outcomes), loop.time() - start


def _run(
    settings: Settings,
    questions: Sequence[RecordedQuestion],
    method: Method,
    seed: int,
    args: argparse.Namespace,
) -> dict[str, float]:
    """One method, one seed: its figures, seconds modelled."""
    main = _timed(settings, questions, method, seed)
    if args.clock == "virtual":
        (outcomes, seconds), _ = run_virtual(main)
    else:
        outcomes, seconds = asyncio.run(main)
    n = len(outcomes)
    wrong = 0
    for question, outcome in zip(questions, outcomes, strict=True):
        gold = gold_key(question)
        wrong += outcome.answer is None or gold is None or outcome.answer != gold
    return {
        "error": wrong / n,
        "samples": sum(o.samples for o in outcomes) / n,
        "tokens": sum(o.tokens for o in outcomes) / n,
        "cut": sum(o.cut for o in outcomes) / n,
        "seconds": seconds / args.time_scale,
    }


def _warm_keys(questions: Sequence[RecordedQuestion]) -> None:
    """Keys every recorded answer once, so that no timed run pays for a first sympy parse
    (the cache keeps them): the first method run would pay for all the others."""
    for question in questions:
        kind = cast(AnswerKind, answer_format(question))
        for sample in question.samples:
            answer = extract(render(sample.answer, kind)[0], kind)
            if answer is not None:
                canonical_key(answer, kind)


def evaluate(set_name: str, args: argparse.Namespace) -> str:
    """The table of one set."""
    _, report = halves(set_name, args.seed)
    _warm_keys(report)
    with tempfile.TemporaryDirectory() as folder:
        data = Path(folder) / "set.jsonl"
        write_recording(data, report)
        settings = Settings(
            engine="replay",
            data=data,
            replay_profile=args.profile,
            replay_time_scale=args.time_scale,
            replay_capacity=args.capacity,
        )
        rows: list[tuple[str, str, list[dict[str, float]]]] = []

        def measure(budget: str, name: str, method: Method) -> None:
            runs = [_run(settings, report, method, seed, args) for seed in range(args.reps)]
            rows.append((budget, name, runs))

        measure(str(SC_SAMPLES), f"SC@{SC_SAMPLES}", partial(sc, budget=SC_SAMPLES))
        for budget in args.budgets:
            for name, method in methods(budget):
                measure(str(budget), name, method)
    sc_tokens = statistics.fmean(r["tokens"] for r in rows[0][2])
    lines = [
        f"### {set_name}: {len(report)} questions at once, {args.reps} seeds, "
        f"capacity {args.capacity}, {args.clock} clock\n",
        "| budget | method | error | samples/q | tokens/q | tokens vs SC@32 | modelled s | cut/q |",
        "|---:|---|---:|---:|---:|---:|---:|---:|",
    ]
    for budget, name, runs in rows:
        mean = {k: statistics.fmean(r[k] for r in runs) for k in runs[0]}
        lines.append(
            f"| {budget} | {name} | {mean['error']:.3f} | {mean['samples']:.1f} | "
            f"{mean['tokens']:.0f} | {mean['tokens'] / sc_tokens:.2f} | "
            f"{mean['seconds']:.1f} | {mean['cut']:.1f} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sets", default="real,flat-d1,flat-d0,peaked-d1")
    parser.add_argument("--budgets", type=int, nargs="+", default=[12, 16, 32])
    parser.add_argument("--reps", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0, help="the split of the sets")
    parser.add_argument("--profile", default="qwen2.5-7b-h100")
    parser.add_argument("--time-scale", type=float, default=0.05)
    parser.add_argument("--capacity", type=int, default=256)
    parser.add_argument(
        "--clock",
        choices=("real", "virtual"),
        default="real",
        help="real: real seconds over --time-scale; virtual: the engine's modelled time alone",
    )
    args = parser.parse_args(argv)
    started = time.perf_counter()
    try:
        for set_name in filter(None, args.sets.split(",")):
            print(evaluate(set_name, args), flush=True)
    finally:
        shutdown_keys()
    print(f"({time.perf_counter() - started:.0f} s)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
