"""The paper's sample-efficiency measurement (docs/policies.md, "Simulator").

Methods whose choices do not depend on the budget give their whole error
curve in one run per repetition; budget-aware ones (:func:`is_budget_aware`,
and the online method) are run at each budget their search needs, each
charged the mean samples it actually spent there.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field

import numpy as np
from numpy.typing import NDArray

from blendserve.core.online_rule import OnlineRule
from blendserve.core.policies import DEFAULT_POLICY, POLICIES, PolicySpec
from blendserve.sim.data import Dataset
from blendserve.sim.online import run_online
from blendserve.sim.runner import run_policy, run_sc

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
_Map = Callable[
    [Callable[[tuple[str, int, int, int]], NDArray[np.int32]], list[tuple[str, int, int, int]]],
    Iterator[NDArray[np.int32]],
]


def parse_policy(label: str) -> PolicySpec:
    """A method's policy; ``default`` (options too: ``default:floor=0``) is what /solve runs."""
    name, sep, rest = label.partition(":")
    return PolicySpec.parse(f"{DEFAULT_POLICY}{sep}{rest}" if name == "default" else label)


def _init_worker(dataset: Dataset) -> None:
    global _dataset
    _dataset = dataset


def _run_in_worker(args: tuple[str, int, int, int]) -> NDArray[np.int32]:
    label, budget, seed, batch = args
    assert _dataset is not None
    if label == "sc":
        return run_sc(_dataset, budget // _dataset.num_questions, seed)
    return run_policy(_dataset, parse_policy(label), budget, seed, batch)


def _online_in_worker(args: tuple[str, int, int, int]) -> tuple[int, int]:
    label, budget, seed, _ = args
    assert _dataset is not None
    run = run_online(_dataset, OnlineRule.parse(label), budget / _dataset.num_questions, seed)
    return run.num_wrong, int(run.samples.sum())


def _is_online(label: str) -> bool:
    return label.split(":")[0] == "online"


@dataclass(frozen=True)
class Curve:
    """Mean reducible error against mean samples per question.

    Attributes:
        samples: mean samples per question at each point.
        errors: reducible error at each point, averaged over repetitions.
    """

    samples: NDArray[np.float64]
    errors: NDArray[np.float64]


@dataclass(frozen=True)
class MethodResult:
    """How cheaply one method matched SC@x.

    Attributes:
        samples: least mean samples per question reaching SC@x's error (x when
            it never did, as in the paper).
        ratio: ``x / samples``.
        reached: whether the method reached the target within x.
    """

    samples: float
    ratio: float
    reached: bool


@dataclass
class TargetResult:
    """One row group of the table: SC@x's error and every method's cost."""

    target: int
    sc_error: float
    methods: dict[str, MethodResult] = field(default_factory=dict)


class _Runner:
    """Runs repetitions inline or on a process pool."""

    def __init__(self, dataset: Dataset, reps: int, seed: int, batch: int, map_fn: _Map) -> None:
        self.dataset = dataset
        self.seeds = [seed + r for r in range(reps)]
        self.batch = batch
        self._map = map_fn
        self._final_errors: dict[tuple[str, int], float] = {}
        # (label, budget) -> mean samples per question actually spent
        self.spent: dict[tuple[str, int], float] = {}

    def runs(self, label: str, budget: int) -> list[NDArray[np.int32]]:
        tasks = [(label, budget, s, self.batch) for s in self.seeds]
        return list(self._map(_run_in_worker, tasks))

    def curve(self, label: str, budget: int) -> Curve:
        """Error after every sample, averaged; a run that stopped early keeps its last error.

        Plain SC is measured at whole samples per question only.
        """
        runs = self.runs(label, budget)
        length = max(len(r) for r in runs)
        padded = np.stack([np.pad(r, (0, length - len(r)), mode="edge") for r in runs])
        n = self.dataset.num_questions
        step = n if label == "sc" else 1
        return Curve(np.arange(1, length + 1) * step / n, padded.mean(axis=0) / n)

    def final_error(self, label: str, budget: int) -> float:
        """Mean reducible error at the end of runs with this budget (memoised)."""
        key = (label, budget)
        if key not in self._final_errors and _is_online(label):
            tasks = [(label, budget, s, self.batch) for s in self.seeds]
            results = list(self._map(_online_in_worker, tasks))  # type: ignore[arg-type]
            n = self.dataset.num_questions * len(results)
            self._final_errors[key] = sum(wrong for wrong, _ in results) / n
            self.spent[key] = sum(spent for _, spent in results) / n
        if key not in self._final_errors:
            runs = self.runs(label, budget)
            n = self.dataset.num_questions * len(runs)
            self._final_errors[key] = sum(int(r[-1]) for r in runs) / n
            self.spent[key] = sum(len(r) for r in runs) / n
        return self._final_errors[key]


@contextmanager
def _runner(dataset: Dataset, reps: int, seed: int, batch: int, jobs: int) -> Iterator[_Runner]:
    if jobs <= 1:
        _init_worker(dataset)
        yield _Runner(dataset, reps, seed, batch, map)
        return
    with ProcessPoolExecutor(jobs, initializer=_init_worker, initargs=(dataset,)) as pool:
        yield _Runner(dataset, reps, seed, batch, pool.map)


def _first_crossing(curve: Curve, bar: float, limit: float) -> float | None:
    hits = np.flatnonzero((curve.errors <= bar) & (curve.samples <= limit + 1e-9))
    return float(curve.samples[hits[0]]) if len(hits) else None


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
    """The paper's table: samples each method needs to match SC@x, for each x of ``targets``.

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
            row = TargetResult(x, bar)
            guesses = [s for c in fixed.values() if (s := _first_crossing(c, bar, x)) is not None]
            for label in methods:
                if label not in fixed:
                    # Run at each budget searched, charged what it spent there (a
                    # paced or stopping method may spend less than its budget).
                    error_at = functools.partial(runner.final_error, label)
                    guess = min(guesses, default=x / 2)
                    found = _search_budget(error_at, bar, n, x * n, guess)
                    samples = None if found is None else runner.spent[(label, found)]
                elif label == "sc":
                    samples = float(x)  # the bar itself
                else:
                    samples = _first_crossing(fixed[label], bar, x)
                reached = samples is not None
                cost = samples if samples is not None else float(x)
                row.methods[label] = MethodResult(cost, x / cost, reached)
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
    return Curve(np.asarray(spent), np.asarray(errors))


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
