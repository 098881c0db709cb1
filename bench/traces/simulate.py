"""What voting and stopping on a trace's confidence and length give, against counting,
DeepConf online and offline, and SC@32, on recordings whose samples carry both.

    python -m bench.traces.simulate [--reps 3] [--sets real,flat-d0,flat-d1,peaked-d0,peaked-d1]
        [--recording bench/recordings/data/qwen2.5-coder-0.5b.jsonl] [--workers 2]

Each set is a pair of question sets, one to choose on and one to report on: the real
recording split in two halves by a seeded shuffle (A chooses, B reports; then the swap),
a synthetic family (``flat`` or ``peaked``, confidence informative to degree ``d``, see
:mod:`blendserve.sim.trace_data`) drawn twice, independently. On the choosing set each
method's setting is chosen (a trace rule's options; the best combination of a vote, a
cut and ``first_m``), with a learner taught by that set (agreement with each question's
plurality, no gold); on the reporting set the chosen setting runs with the same learner,
so neither the settings nor the learning saw the reported questions. "cold" is the best
combination with an empty learner: what a client's first batch gets.

A method is reported at the least budget (samples a question; DeepConf's: its cap of
traces) of ``--budgets`` at which its error, averaged over ``--reps`` seeds, reaches
SC@32's on the same set (">" where no budget does: figures at the largest): error
(share of questions answered wrong), samples and completion tokens a question (a cut
sample's tokens up to its cut), samples cut a question, and tokens against SC@32's.
A setting is chosen by the fewest tokens at that budget (no budget reaching: the least
error). Standard errors are over the seeds' draws, on one question set.

DeepConf online warms up on 16 traces, or on half its cap where that is smaller (at
least 2). ``first_m`` cuts within the default policy's waves.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from blendserve.core.traces import TraceLearner, TraceRule, parse_trace_rule
from blendserve.sim.trace_data import trace_recording
from blendserve.sim.traces import (
    TraceQuestion,
    TraceRun,
    learner_from,
    load_traces,
    run_deepconf_offline,
    run_deepconf_online,
    run_ours,
    run_sc,
    trace_questions,
)

RECORDING = Path(__file__).parents[1] / "recordings" / "data" / "qwen2.5-coder-0.5b.jsonl"
SETS = ("real", "flat-d0", "flat-d1", "peaked-d0", "peaked-d1")
BUDGETS = (4, 6, 8, 12, 16, 24, 32, 40)
SC_K = 32

#: Each method of ours: the settings the choosing set picks from.
OURS: dict[str, tuple[str, ...]] = {
    "count (default)": ("count",),
    "weighted": ("weighted:measure=auto", "weighted:measure=length"),
    "filter": (
        "filter:measure=auto,keep=0.9",
        "filter:measure=auto,keep=0.5",
        "filter:measure=auto,keep=0.1",
    ),
    "cut": ("count:cut=10", "count:cut=30", "count:cut=50"),
    "first_m": ("count:first_m=1", "count:first_m=2", "count:first_m=4"),
}
#: DeepConf's methods: name -> (online?, eta).
DEEPCONF = {
    "DeepConf online low (eta 10)": (True, 10.0),
    "DeepConf online high (eta 90)": (True, 90.0),
    "DeepConf offline (eta 10)": (False, 10.0),
    "DeepConf offline (eta 90)": (False, 90.0),
}

Runner = Callable[[Sequence[TraceQuestion], int, int], TraceRun]


@dataclass
class Point:
    """A method at one budget, over the seeds."""

    budget: int
    reached: bool
    runs: list[TraceRun]

    def mean(self, figure: Callable[[TraceRun], float]) -> float:
        return statistics.fmean(figure(r) for r in self.runs)

    def se(self, figure: Callable[[TraceRun], float]) -> float:
        values = [figure(r) for r in self.runs]
        return statistics.stdev(values) / math.sqrt(len(values)) if len(values) > 1 else 0.0


def _error(run: TraceRun) -> float:
    return run.error


def _tokens(run: TraceRun) -> float:
    return run.tokens_per_question


def _samples(run: TraceRun) -> float:
    return run.samples_per_question


def _cut(run: TraceRun) -> float:
    return run.num_cut / len(run.right)


def reach(
    runner: Runner,
    questions: Sequence[TraceQuestion],
    target: float,
    budgets: Sequence[int],
    reps: int,
) -> Point:
    """The least budget at which ``runner``'s mean error reaches ``target`` (else the
    largest budget, not reached)."""
    point = None
    for budget in budgets:
        runs = [runner(questions, budget, seed) for seed in range(reps)]
        point = Point(budget, statistics.fmean(r.error for r in runs) <= target + 1e-12, runs)
        if point.reached:
            return point
    assert point is not None
    return point


def _better(a: Point, b: Point) -> bool:
    """Whether ``a`` beats ``b`` as a choice: reaching first, then fewer tokens; neither
    reaching, the lower error."""
    if a.reached != b.reached:
        return a.reached
    if a.reached:
        return a.mean(_tokens) < b.mean(_tokens)
    return a.mean(_error) < b.mean(_error)


def _ours(rule: TraceRule, learner: TraceLearner) -> Runner:
    return lambda qs, budget, seed: run_ours(qs, rule, learner, budget, seed)


def _effective(rule: TraceRule, learner: TraceLearner) -> TraceRule:
    """The rule that runs as ``rule`` does with ``learner``: a vote whose measure has shown
    no signal counts, a cut with no bar is none (so that equal runs are run once)."""
    vote = rule.vote
    if vote != "count" and learner.strength(learner.chosen(rule)) <= 0.0:
        vote = "count"
    cut = rule.cut if learner.bar(rule) is not None else None
    if vote == "count":
        return TraceRule(cut=cut, first_m=rule.first_m)
    return TraceRule(vote, rule.measure, rule.keep, cut, rule.first_m)


class _Reach:
    """:func:`reach` for rules of ours, each effective rule run once per question set."""

    def __init__(self, learner: TraceLearner, budgets: Sequence[int], reps: int) -> None:
        self.learner, self.budgets, self.reps = learner, budgets, reps
        self._seen: dict[tuple[int, str, float], Point] = {}

    def __call__(self, text: str, questions: list[TraceQuestion], target: float) -> Point:
        rule = _effective(parse_trace_rule(text), self.learner)
        key = (id(questions), str(rule), target)
        if key not in self._seen:
            runner = _ours(rule, self.learner)
            self._seen[key] = reach(runner, questions, target, self.budgets, self.reps)
        return self._seen[key]


def _combine(vote: str, cut: str | None, first_m: str | None) -> str:
    """A rule text made of ``vote``'s vote and options, ``cut``'s cut and ``first_m``'s."""
    rule = parse_trace_rule(vote)
    options = {"measure": rule.measure, "keep": rule.keep}
    if cut is not None:
        options["cut"] = parse_trace_rule(cut).cut
    if first_m is not None:
        options["first_m"] = parse_trace_rule(first_m).first_m
    return str(TraceRule(rule.vote, **options))  # type: ignore[arg-type]


def evaluate(
    name: str,
    choose: list[TraceQuestion],
    report: list[TraceQuestion],
    budgets: Sequence[int],
    reps: int,
) -> str:
    """The markdown table of one (choosing set, reporting set) pair."""
    started = time.perf_counter()
    learner = learner_from(choose)
    ours = _Reach(learner, budgets, reps)
    choose_target = statistics.fmean(run_sc(choose, SC_K, s).error for s in range(reps))
    sc_point = Point(SC_K, True, [run_sc(report, SC_K, s) for s in range(reps)])
    target = sc_point.mean(_error)
    rows: list[tuple[str, str, Point]] = [("SC@32", "-", sc_point)]
    chosen: dict[str, str] = {}
    for method, settings in OURS.items():
        best_setting, best_point = settings[0], None
        for setting in settings if len(settings) > 1 else ():
            point = ours(setting, choose, choose_target)
            if best_point is None or _better(point, best_point):
                best_setting, best_point = setting, point
        chosen[method] = best_setting
    combos = {
        _combine(vote, cut, first_m)
        for vote in (chosen["weighted"], chosen["filter"])
        for cut in (None, chosen["cut"])
        for first_m in (None, chosen["first_m"])
    }
    best_combo, best_point = "", None
    for combo in sorted(combos):
        point = ours(combo, choose, choose_target)
        if best_point is None or _better(point, best_point):
            best_combo, best_point = combo, point
    chosen["best combination"] = best_combo
    for method, setting in chosen.items():
        point = ours(setting, report, target)
        rows.append((method, setting, point))
    cold = _Reach(TraceLearner(), budgets, reps)(best_combo, report, target)
    rows.append(("best combination, cold", best_combo, cold))
    for method, (online, eta) in DEEPCONF.items():
        runner: Runner = (
            (lambda qs, b, s, e=eta: run_deepconf_online(qs, b, e, s))  # type: ignore[misc]
            if online
            else (lambda qs, b, s, e=eta: run_deepconf_offline(qs, b, e, s))  # type: ignore[misc]
        )
        rows.append((method, f"eta={eta:g}", reach(runner, report, target, budgets, reps)))
    sc_tokens = sc_point.mean(_tokens)
    strengths = ", ".join(f"{m} {v:.2f}" for m, v in learner.summary().items())
    lines = [
        f"### {name}",
        "",
        f"{len(choose)} questions choose, {len(report)} report; SC@32 error on the reported "
        f"set {target:.3f}; learner strengths: {strengths}; "
        f"{time.perf_counter() - started:.0f} s",
        "",
        "| method | setting | budget/q | error | samples/q | tokens/q | tokens vs SC@32 | cut/q |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for method, setting, point in rows:
        budget = f"{point.budget}" if point.reached else f">{point.budget}"
        lines.append(
            f"| {method} | `{setting}` | {budget} | {point.mean(_error):.3f} ± "
            f"{point.se(_error):.3f} | {point.mean(_samples):.1f} | {point.mean(_tokens):.0f} ± "
            f"{point.se(_tokens):.0f} | {point.mean(_tokens) / sc_tokens:.2f} | "
            f"{point.mean(_cut):.1f} |"
        )
    return "\n".join(lines) + "\n"


def _pairs(
    set_name: str, recording: Path, questions: int, samples: int, length_ratio: float, seed: int
) -> list[tuple[str, list[TraceQuestion], list[TraceQuestion]]]:
    if set_name == "real":
        loaded = load_traces(recording)
        order = np.random.default_rng(seed).permutation(len(loaded))
        half_a = [loaded[i] for i in sorted(order[: len(loaded) // 2])]
        half_b = [loaded[i] for i in sorted(order[len(loaded) // 2 :])]
        return [
            (f"{recording.name}: choose on A, report on B", half_a, half_b),
            (f"{recording.name}: choose on B, report on A", half_b, half_a),
        ]
    family, degree = set_name.split("-d")
    d = float(degree)
    ratio = length_ratio if d > 0 else 1.0

    def draw(s: int) -> list[TraceQuestion]:
        return trace_questions(trace_recording(family, questions, samples, d, ratio, seed=s))

    title = f"synthetic {family}, d={d:g}, length ratio {ratio:g}"
    return [(title, draw(seed + 1), draw(seed))]


def _task(args: tuple[str, str, list[TraceQuestion], list[TraceQuestion], list[int], int]) -> str:
    _, name, choose, report, budgets, reps = args
    return evaluate(name, choose, report, budgets, reps)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--recording", type=Path, default=RECORDING)
    parser.add_argument("--sets", default=",".join(SETS), help="of " + ", ".join(SETS))
    parser.add_argument("--reps", type=int, default=3, help="seeds per method and budget")
    parser.add_argument("--budgets", default=",".join(map(str, BUDGETS)))
    parser.add_argument("--questions", type=int, default=100, help="per synthetic set")
    parser.add_argument("--samples", type=int, default=32, help="per synthetic question")
    parser.add_argument(
        "--length-ratio",
        type=float,
        default=1.2,
        help="wrong to right length in the informative synthetic sets",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args(argv)
    sets = [s for s in args.sets.split(",") if s]
    unknown = [s for s in sets if s not in SETS]
    if unknown or args.reps < 1:
        print(f"bench.traces.simulate: unknown sets {unknown} or reps below 1", file=sys.stderr)
        return 2
    budgets = sorted(int(b) for b in args.budgets.split(","))
    tasks = [
        (set_name, name, choose, report, budgets, args.reps)
        for set_name in sets
        for name, choose, report in _pairs(
            set_name, args.recording, args.questions, args.samples, args.length_ratio, args.seed
        )
    ]
    print(f"## Trace rules against SC@{SC_K} (reps {args.reps}, budgets {budgets})\n")
    if args.workers > 1:
        with ProcessPoolExecutor(args.workers) as pool:
            for table in pool.map(_task, tasks):
                print(table, flush=True)
    else:
        for task in tasks:
            print(_task(task), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
