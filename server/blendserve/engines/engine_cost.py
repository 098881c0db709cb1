"""What the engine's decode steps cost, as the service knows it: a profile, refined live.

A profile (``--engine-profile``) is the prior. A vLLM engine, upstream or in
process, also shows its steps' cost in its Prometheus series while it serves:
:class:`EngineCost` turns readings taken while this process kept it busy into
observations and fits them (docs/engines.md, "The cost model the service keeps").
An upstream's ``/metrics`` can say anything, so every reading is checked first
and the fit, its context and ``/health`` stay finite whatever it reports.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import numpy as np
from scipy import optimize

from blendserve.engines.step_cost import StepCost
from blendserve.stats import NO_STATS, Stats

__all__ = [
    "COST_SERIES",
    "MAX_CONTEXT",
    "MAX_COUNTER",
    "MIN_STEPS",
    "MIN_STEP_MS",
    "MIN_WIDTH_SPREAD",
    "REPORTED_WIDTHS",
    "WINDOW",
    "Busy",
    "CostPoint",
    "EngineCost",
    "cost_counters",
]

# vLLM's steps (one iteration-tokens observation a step, of the tokens it computed:
# prompt tokens and one a sequence sampled), the tokens sampled, and finished requests'
# lengths.
_STEPS = "vllm:iteration_tokens_total"
_SAMPLED = "vllm:generation_tokens_total"
_PROMPT = "vllm:request_prompt_tokens"
_GENERATION = "vllm:request_generation_tokens"

#: The series read for the live estimate (each summed over its label sets).
COST_SERIES: tuple[str, ...] = (
    *(f"{name}_{part}" for name in (_STEPS, _PROMPT, _GENERATION) for part in ("sum", "count")),
    _SAMPLED,
)
#: Observations kept for the live fit.
WINDOW = 256
#: Steps an observation needs (fewer: the readings are merged until it has them).
MIN_STEPS = 10
#: How far apart (a ratio) the widths seen must be to fit a line through them.
MIN_WIDTH_SPREAD = 2.0
#: Widths at which ``/metrics`` and ``/health`` show the step time.
REPORTED_WIDTHS = (1, 8, 32, 128, 512)
_DEFAULT_CTX = 1024.0
#: The largest mean context (tokens) taken from an engine's series: larger than any model's
#: window, so a larger one is a lie.
MAX_CONTEXT = 10_000_000.0
#: The largest value a counter of these series may hold: past 2**53 a float no longer holds
#: every whole number, so a token or request counter there is no real one.
MAX_COUNTER = float(2**53)
#: The shortest decode step believed (ms): no engine steps a model a thousand times a
#: millisecond, so fewer milliseconds a step are a step count that lies.
MIN_STEP_MS = 1e-3
# Series that count requests: whole numbers, the divisor of the mean context.
_WHOLE = frozenset({f"{_PROMPT}_count", f"{_GENERATION}_count"})


def _holdable(name: str, value: float) -> bool:
    """Whether a counter of series ``name`` can hold ``value``."""
    if not (math.isfinite(value) and 0.0 <= value <= MAX_COUNTER):
        return False
    return name not in _WHOLE or float(value).is_integer()


def cost_counters(samples: Iterable[tuple[str, float]]) -> dict[str, float]:
    """The :data:`COST_SERIES` among ``(name, value)`` samples, each summed over its label sets.

    A series with a value no counter can hold (not finite, negative, past
    :data:`MAX_COUNTER`, a request count that is not whole), in any label set
    or summed, is left out.
    """
    totals: dict[str, float] = {}
    bad: set[str] = set()
    for name, value in samples:
        if name in COST_SERIES:
            if _holdable(name, value):
                totals[name] = totals.get(name, 0.0) + value
            else:
                bad.add(name)
    return {name: v for name, v in totals.items() if name not in bad and _holdable(name, v)}


@dataclass(frozen=True)
class CostPoint:
    """One observation: ``steps`` steps of ``batch`` sequences and ``prompt`` prompt tokens
    each (means), ``ms`` each."""

    batch: float
    ms: float
    steps: float
    prompt: float = 0.0


class Busy:
    """The requests this process has on an engine, and since when it has had some without a
    break (``since``, monotonic seconds; None: none now): the time its steps took."""

    def __init__(self) -> None:
        self.requests = 0
        self.since: float | None = None

    def enter(self) -> None:
        """One more request on the engine."""
        if not self.requests:
            self.since = time.monotonic()
        self.requests += 1

    def leave(self) -> None:
        """One request fewer."""
        self.requests -= 1
        if not self.requests:
            self.since = None


@dataclass(frozen=True)
class _Reading:
    """One reading of a source's :data:`COST_SERIES`, taken at ``at`` (monotonic seconds)."""

    counters: Mapping[str, float]
    at: float


def _context_delta(now: Mapping[str, float], first: Mapping[str, float]) -> tuple[float, float]:
    """Requests finished between two readings, and their prompt plus half their generation
    tokens, summed."""

    def delta(name: str) -> float:
        return now.get(name, 0.0) - first.get(name, 0.0)

    tokens = delta(f"{_PROMPT}_sum") + delta(f"{_GENERATION}_sum") / 2
    return tokens, delta(f"{_PROMPT}_count")


def _went_down(now: Mapping[str, float], before: Mapping[str, float]) -> bool:
    """Whether a series of ``before`` is lower in ``now``, or gone from it."""
    return any(now.get(name, -math.inf) < value for name, value in before.items())


def _plausible_context(tokens: float, requests: float) -> bool:
    """Whether ``requests`` finished requests of ``tokens`` context tokens in all make a mean
    context an engine can have (none finished: nothing to judge)."""
    if not (math.isfinite(tokens) and math.isfinite(requests)) or tokens < 0 or requests < 0:
        return False
    return requests == 0 or tokens / requests <= MAX_CONTEXT


class EngineCost:
    """The engine's step cost: a prior profile, observations from vLLM's series, their fit.

    Args:
        prior: the configured profile (None: none, learnt from traffic alone).
        source: where the prior came from, as ``/health`` says it.
        sink: where the step times at :data:`REPORTED_WIDTHS` are reported when they change.
    """

    def __init__(self, prior: StepCost | None = None, source: str = "", sink: Stats = NO_STATS):
        self.prior = prior
        self.source = source or (prior.name if prior is not None else "")
        self.sink = sink
        self.points: deque[CostPoint] = deque(maxlen=WINDOW)
        self._last: dict[str, _Reading] = {}
        self._first: dict[str, Mapping[str, float]] = {}
        self._fit = prior
        self.report()

    def report_to(self, sink: Stats) -> None:
        """Reports to ``sink`` from now on, starting with the current step times."""
        self.sink = sink
        self.report()

    def report(self) -> None:
        """Tells the sink the step time at :data:`REPORTED_WIDTHS` (nothing while unknown)."""
        fit = self._fit
        if fit is not None:
            self.sink.engine_step_cost(
                {b: fit.step_ms(b, self._ctx) / 1000 for b in REPORTED_WIDTHS}, len(self.points)
            )

    @property
    def _ctx(self) -> float:
        """The mean context of the requests finished since each source's first reading."""
        tokens = requests = 0.0
        for source, first in self._first.items():
            more, count = _context_delta(self._last[source].counters, first)
            tokens, requests = tokens + more, requests + count
        ctx = tokens / requests if requests > 0 else _DEFAULT_CTX
        # observe() keeps no reading that makes it otherwise; this only keeps that promise.
        return ctx if 0.0 <= ctx <= MAX_CONTEXT else _DEFAULT_CTX

    @property
    def current(self) -> StepCost | None:
        """The fit in use: the live one where there is one, else the prior (None: unknown)."""
        return self._fit

    def observe(
        self, source: str, counters: Mapping[str, float], at: float, busy_since: float | None
    ) -> CostPoint | None:
        """Takes one reading of ``source``'s :data:`COST_SERIES`; the observation it made, if any.

        Args:
            source: the engine read (an upstream's URL, or the in-process engine).
            counters: the series, as :func:`cost_counters` gives them.
            at: when they were read (monotonic seconds).
            busy_since: since when this process has had requests on the engine
                without a break (None: none now).

        Only the time the engine was kept busy is its steps' time: a reading made
        while it idled, or after a break, starts the next observation; one with fewer
        than :data:`MIN_STEPS` steps waits for the next. A reading whose counters went
        down or lost a series (a restart), or that makes the mean context absurd,
        starts over, so a one-off jump does not stop the learning for good.
        """
        counters = cost_counters(counters.items())  # whoever read them, checked here
        reading = _Reading(counters, at)
        before = self._last.get(source)
        steps_name = f"{_STEPS}_count"
        if (
            before is None
            or _went_down(counters, before.counters)
            or not _plausible_context(*_context_delta(counters, self._first[source]))
        ):
            self._last[source] = reading
            self._first[source] = reading.counters
            return None
        if busy_since is None or busy_since > before.at:
            self._last[source] = reading
            return None
        steps = counters.get(steps_name, 0.0) - before.counters.get(steps_name, 0.0)
        if steps < MIN_STEPS:
            return None
        self._last[source] = reading

        def delta(name: str) -> float:
            return counters.get(name, 0.0) - before.counters.get(name, 0.0)

        tokens, sampled = delta(f"{_STEPS}_sum"), delta(_SAMPLED)
        ms = 1000 * (at - before.at) / steps
        if tokens <= 0 or tokens / steps > MAX_CONTEXT or not ms >= MIN_STEP_MS:
            return None
        prompt = max(0.0, tokens - sampled) if _SAMPLED in counters else 0.0
        width = max(1.0, (tokens - prompt) / steps)
        point = CostPoint(width, ms, steps, prompt / steps)
        self.points.append(point)
        self._fit = self._refit()
        self.report()
        return point

    def _refit(self) -> StepCost | None:
        points = list(self.points)
        steps = [p.steps for p in points]
        ctx = self._ctx
        widths = [p.batch for p in points]
        prior = self.prior
        if max(widths) >= MIN_WIDTH_SPREAD * min(widths):
            batch, prompt, ms, weight = np.array(
                [(p.batch, p.prompt, p.ms, p.steps) for p in points]
            ).T
            root = np.sqrt(weight)
            design = np.stack([np.ones_like(batch), batch, prompt], axis=1)
            (at_ctx, per_width, _), _ = optimize.nnls(design / ms[:, None] * root[:, None], root)
            return StepCost(float(at_ctx), float(per_width), 0.0, 0.0, name="live")
        if prior is None:
            return None
        scale = float(
            np.average(
                [p.ms / prior.step_ms(round(p.batch), ctx, p.batch + p.prompt) for p in points],
                weights=steps,
            )
        )
        return StepCost(
            base_ms=scale * prior.base_ms,
            per_sequence_ms=scale * prior.per_sequence_ms,
            per_sequence_context_ms=scale * prior.per_sequence_context_ms,
            per_context_ms=scale * prior.per_context_ms,
            name=f"{self.source} x {scale:.3g}",
        )

    def describe(self) -> dict[str, object] | None:
        """What ``/health`` shows: the fit's source and fields, its step times, the observations."""
        fit = self._fit
        if fit is None and not self.points:
            return None
        return {
            "profile": self.source or None,
            "live_observations": len(self.points),
            "context": round(self._ctx),
            "fit": None if fit is None else fit.as_dict(),
            "step_ms": None
            if fit is None
            else {str(b): round(fit.step_ms(b, self._ctx), 3) for b in REPORTED_WIDTHS},
        }
