"""The paper's sample-efficiency measurement (docs/policies.md, "Simulator").

Methods whose choices do not depend on the budget give their whole error
curve in one run per repetition; budget-aware ones (:func:`is_budget_aware`,
and the online method) are run at each budget their search needs, each
charged the mean samples it actually spent there. On a recording with
lengths, each is charged tokens too: a sample of question q costs q's mean
recorded tokens (:meth:`~blendserve.sim.data.Dataset.mean_tokens`), so a run
spends ``sum over q of samples(q) * mean_tokens[q]``.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
from numpy.typing import NDArray

from blendserve.core.online_rule import OnlineRule
from blendserve.core.policies import DEFAULT_POLICY, POLICIES, PolicySpec
from blendserve.sim.data import Dataset
from blendserve.sim.online import run_online
from blendserve.sim.runner import run_policy, run_sc, trace_policy

__all__ = [
    "Curve",
    "MethodResult",
    "TargetResult",
    "is_budget_aware",
    "parse_policy",
    "sample_efficiency",
    "sc_scaling_exponent",
]

# Blend-ASC's budget search stops when its bracket is this tight (relative).
_SEARCH_TOLERANCE = 0.02

_dataset: Dataset | None = None
_tokens: NDArray[np.float64] | None = None  # question -> a sample's tokens (None: no lengths)
# One run: wrong after each sample, and where the data has lengths the tokens spent so far.
_Run = tuple[NDArray[np.int32], NDArray[np.float64] | None]
# map() or a process pool's: a worker function over its tasks
_Map = Callable[
    [Callable[[tuple[str, int, int, int]], Any], list[tuple[str, int, int, int]]], Iterator[Any]
]


def parse_policy(label: str) -> PolicySpec:
    """A method's policy; ``default`` (options too: ``default:floor=0``) is what /solve runs."""
    name, sep, rest = label.partition(":")
    return PolicySpec.parse(f"{DEFAULT_POLICY}{sep}{rest}" if name == "default" else label)


def _init_worker(dataset: Dataset, tokens: NDArray[np.float64] | None) -> None:
    global _dataset, _tokens
    _dataset, _tokens = dataset, tokens


def _run_in_worker(args: tuple[str, int, int, int]) -> _Run:
    label, budget, seed, batch = args
    assert _dataset is not None
    if label == "sc":  # every question alike: its tokens follow from its samples
        return run_sc(_dataset, budget // _dataset.num_questions, seed), None
    if _tokens is None:
        return run_policy(_dataset, parse_policy(label), budget, seed, batch), None
    run = trace_policy(_dataset, parse_policy(label), budget, seed, batch)
    return run.wrong, np.cumsum(_tokens[run.questions])


def _online_in_worker(args: tuple[str, int, int, int]) -> tuple[int, int, float]:
    label, budget, seed, _ = args
    assert _dataset is not None
    run = run_online(_dataset, OnlineRule.parse(label), budget / _dataset.num_questions, seed)
    tokens = 0.0 if _tokens is None else float(run.samples @ _tokens[run.questions])
    return run.num_wrong, int(run.samples.sum()), tokens


def _is_online(label: str) -> bool:
    return label.split(":")[0] == "online"


@dataclass(frozen=True)
class Curve:
    """Mean reducible error against mean samples per question.

    Attributes:
        samples: mean samples per question at each point.
        errors: reducible error at each point, averaged over repetitions.
        tokens: mean completion tokens per question at each point (None: the data
            records no lengths).
    """

    samples: NDArray[np.float64]
    errors: NDArray[np.float64]
    tokens: NDArray[np.float64] | None = None


@dataclass(frozen=True)
class MethodResult:
    """How cheaply one method matched SC@x.

    Attributes:
        samples: least mean samples per question reaching SC@x's error (x when
            it never did, as in the paper).
        ratio: ``x / samples``.
        reached: whether the method reached the target within x.
        tokens: mean completion tokens per question spent there (SC@x's when it
            never reached it; None: the data records no lengths).
    """

    samples: float
    ratio: float
    reached: bool
    tokens: float | None = None


@dataclass
class TargetResult:
    """One row group of the table: SC@x's error and every method's cost."""

    target: int
    sc_error: float
    methods: dict[str, MethodResult] = field(default_factory=dict)


class _Runner:
    """Runs repetitions inline or on a process pool."""

    def __init__(
        self,
        dataset: Dataset,
        tokens: NDArray[np.float64] | None,
        reps: int,
        seed: int,
        batch: int,
        map_fn: _Map,
    ) -> None:
        self.dataset = dataset
        self.tokens = tokens
        self.seeds = [seed + r for r in range(reps)]
        self.batch = batch
        self._map = map_fn
        self._final_errors: dict[tuple[str, int], float] = {}
        # (label, budget) -> mean samples (tokens) per question actually spent
        self.spent: dict[tuple[str, int], float] = {}
        self.spent_tokens: dict[tuple[str, int], float] = {}

    def runs(self, label: str, budget: int) -> list[_Run]:
        tasks = [(label, budget, s, self.batch) for s in self.seeds]
        return list(self._map(_run_in_worker, tasks))

    def curve(self, label: str, budget: int) -> Curve:
        """Error (and tokens) after every sample, averaged; a run that stopped early keeps
        its last error and tokens.

        Plain SC is measured at whole samples per question only.
        """
        runs = self.runs(label, budget)
        length = max(len(wrong) for wrong, _ in runs)
        n = self.dataset.num_questions
        step = n if label == "sc" else 1
        samples = np.arange(1, length + 1) * step / n
        errors = _padded_mean([wrong for wrong, _ in runs], length) / n
        tokens = None
        if self.tokens is not None:
            if label == "sc":  # x samples of every question
                tokens = samples * float(self.tokens.mean())
            else:
                spent = [t for _, t in runs if t is not None]
                tokens = _padded_mean(spent, length) / n
        return Curve(samples, errors, tokens)

    def final_error(self, label: str, budget: int) -> float:
        """Mean reducible error at the end of runs with this budget (memoised)."""
        key = (label, budget)
        if key not in self._final_errors and _is_online(label):
            tasks = [(label, budget, s, self.batch) for s in self.seeds]
            results: list[tuple[int, int, float]] = list(self._map(_online_in_worker, tasks))
            n = self.dataset.num_questions * len(results)
            self._final_errors[key] = sum(wrong for wrong, _, _ in results) / n
            self.spent[key] = sum(spent for _, spent, _ in results) / n
            self.spent_tokens[key] = sum(tokens for _, _, tokens in results) / n
        if key not in self._final_errors:
            runs = self.runs(label, budget)
            n = self.dataset.num_questions * len(runs)
            self._final_errors[key] = sum(int(wrong[-1]) for wrong, _ in runs) / n
            self.spent[key] = sum(len(wrong) for wrong, _ in runs) / n
            self.spent_tokens[key] = sum(float(t[-1]) for _, t in runs if t is not None) / n
        return self._final_errors[key]


def _padded_mean(runs: Sequence[NDArray[np.generic]], length: int) -> NDArray[np.float64]:
    """The mean of ``runs`` after each step, each run that ended early kept at its last value."""
    padded = np.stack([np.pad(r, (0, length - len(r)), mode="edge") for r in runs])
    return np.asarray(padded.mean(axis=0), dtype=np.float64)


@contextmanager
def _runner(dataset: Dataset, reps: int, seed: int, batch: int, jobs: int) -> Iterator[_Runner]:
    tokens = dataset.mean_tokens()
    # The workers need the distributions alone: the recorded samples stay here.
    shared = replace(dataset, recorded=None)
    if jobs <= 1:
        _init_worker(shared, tokens)
        yield _Runner(dataset, tokens, reps, seed, batch, map)
        return
    with ProcessPoolExecutor(jobs, initializer=_init_worker, initargs=(shared, tokens)) as pool:
        yield _Runner(dataset, tokens, reps, seed, batch, pool.map)


def _first_crossing(curve: Curve, bar: float, limit: float) -> int | None:
    """The first point of ``curve`` at or under ``bar`` within ``limit`` samples."""
    hits = np.flatnonzero((curve.errors <= bar) & (curve.samples <= limit + 1e-9))
    return int(hits[0]) if len(hits) else None


def _tokens_at(curve: Curve, point: int | None) -> float | None:
    return None if curve.tokens is None or point is None else float(curve.tokens[point])


def _search_budget(
    error_at: Callable[[int], float], bar: float, n: int, limit: int, guess: float
) -> int | None:
    """Least budget (in samples) whose error is at most ``bar``, or None within ``limit``."""
    passed: int | None = None
    failed = n - 1
    budget = min(limit, max(n, round(guess * n)))
    while passed is None:  # bracket upwards from the guess
        if error_at(budget) <= bar:
            passed = budget
        elif budget == limit:
            return None
        else:
            failed = budget
            budget = min(limit, round(budget * 1.5))
    while failed == n - 1 and passed > n:  # bracket downwards
        budget = max(n, round(passed / 1.5))
        if error_at(budget) <= bar:
            passed = budget
        else:
            failed = budget
    while passed - failed > max(1, _SEARCH_TOLERANCE * passed):
        budget = (passed + failed) // 2
        if error_at(budget) <= bar:
            passed = budget
        else:
            failed = budget
    return passed


def sample_efficiency(
    dataset: Dataset,
    targets: Sequence[int],
    methods: Sequence[str],
    *,
    reps: int = 10,
    seed: int = 0,
    batch: int = 1,
    jobs: int = 1,
    curves: dict[str, Curve] | None = None,
) -> list[TargetResult]:
    """The paper's table: samples each method needs to match SC@x, for each x of ``targets``
    (and the tokens it spends there, where the data records lengths: see the module).

    ``methods`` are policy specs such as ``blend`` or ``asc:cap=16``, each point
    averaged over ``reps`` seeded repetitions from ``seed``, ``batch`` questions
    selected per decision, on ``jobs`` worker processes (1 runs inline);
    ``curves``, if given, is filled with each method's error curve (for plots).

    Raises:
        ValueError: a bad method, target or count.
    """
    if not targets or min(targets) < 1:
        raise ValueError("targets must be at least one sample per question")
    if reps < 1 or batch < 1:
        raise ValueError("reps and batch must be at least 1")
    online = {label for label in methods if _is_online(label)}
    for label in online:
        OnlineRule.parse(label)  # reject a bad spec before any run
    specs = {label: parse_policy(label) for label in methods if label not in online}
    n = dataset.num_questions
    top = max(targets)
    results = []
    with _runner(dataset, reps, seed, batch, jobs) as runner:
        sc = runner.curve("sc", top * n)
        fixed = {
            label: sc if label == "sc" else runner.curve(label, top * n)
            for label, spec in specs.items()
            if not is_budget_aware(label)
        }
        if curves is not None:
            curves.update(fixed)
            curves.setdefault("sc", sc)
        for x in sorted(targets):
            bar = float(sc.errors[x - 1])
            sc_tokens = _tokens_at(sc, x - 1)
            row = TargetResult(x, bar)
            guesses = [
                float(c.samples[i])
                for c in fixed.values()
                if (i := _first_crossing(c, bar, x)) is not None
            ]
            for label in methods:
                tokens = None
                if label not in fixed:
                    # Run at each budget searched, charged what it spent there (a
                    # paced or stopping method may spend less than its budget).
                    error_at = functools.partial(runner.final_error, label)
                    guess = min(guesses, default=x / 2)
                    found = _search_budget(error_at, bar, n, x * n, guess)
                    samples = None if found is None else runner.spent[(label, found)]
                    if found is not None and sc_tokens is not None:
                        tokens = runner.spent_tokens[(label, found)]
                elif label == "sc":
                    samples, tokens = float(x), sc_tokens  # the bar itself
                else:
                    point = _first_crossing(fixed[label], bar, x)
                    samples = None if point is None else float(fixed[label].samples[point])
                    tokens = _tokens_at(fixed[label], point)
                reached = samples is not None
                cost = samples if samples is not None else float(x)
                row.methods[label] = MethodResult(
                    cost, x / cost, reached, tokens if reached else sc_tokens
                )
            results.append(row)
    return results


def searched_curve(
    dataset: Dataset,
    label: str,
    grid: Sequence[float],
    *,
    reps: int,
    seed: int,
    batch: int,
    jobs: int,
) -> Curve:
    """A budget-aware policy's error at each budget of ``grid`` (mean samples per question),
    against what it spent there (one run per point and rep)."""
    n = dataset.num_questions
    budgets = sorted({max(n, round(x * n)) for x in grid})
    with _runner(dataset, reps, seed, batch, jobs) as runner:
        errors = [runner.final_error(label, b) for b in budgets]
        spent = [runner.spent[(label, b)] for b in budgets]
        tokens = None
        if runner.tokens is not None:
            tokens = np.asarray([runner.spent_tokens[(label, b)] for b in budgets])
    return Curve(np.asarray(spent), np.asarray(errors), tokens)


def is_budget_aware(label: str) -> bool:
    """Whether a method's choices depend on its budget (it is run per budget)."""
    return POLICIES[parse_policy(label).name].budget_aware


def sc_scaling_exponent(curve: Curve) -> float:
    """Slope of log error against log samples of SC's curve (paper section 3)."""
    keep = curve.errors > 0
    if keep.sum() < 2:
        return math.nan
    fit = np.polyfit(np.log(curve.samples[keep]), np.log(curve.errors[keep]), 1)
    return float(fit[0])
