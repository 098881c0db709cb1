"""Prometheus metrics of the process, served at ``/metrics`` (docs/deployment.md).

Only the service imports this module: engines and schedulers report to a
:class:`~blendserve.stats.Stats` sink, and the service's sink updates these.
Names never contain "vllm" (vLLM's in-process engine unregisters every
collector whose name does), and labels come from the operator's side only.
"""

from __future__ import annotations

import os

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    REGISTRY,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)
from prometheus_client.multiprocess import MultiProcessCollector

from blendserve.core.traces import STOPS

__all__ = [
    "CONTENT_TYPE_LATEST",
    "exposition",
    "pool_dropped",
    "recording_lines",
    "recording_started",
    "upstream_configured",
]

_PREFIX = "blendserve"

SAMPLES_PER_QUESTION = Histogram(
    f"{_PREFIX}_samples_per_question",
    "Samples spent on a question by the time its answer was final.",
    buckets=[2**i for i in range(11)],
)
ANSWER_VOTE_SHARE = Histogram(
    f"{_PREFIX}_answer_vote_share",
    "Winning answer's share of the votes of a final answer.",
    buckets=[0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 0.99, 1.0],
)
ANSWER_PPR_UNCERTAINTY = Histogram(
    f"{_PREFIX}_answer_ppr_uncertainty",
    "PPR-1v1 uncertainty of a final answer (lower: surer).",
    buckets=[1e-4, 1e-3, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0],
)
ANSWERS = Counter(
    f"{_PREFIX}_answers",
    "Final answers, by whether settling stopped them before the budget ran out.",
    ["settled_early"],
)
JOB_DURATION = Histogram(
    f"{_PREFIX}_job_duration_seconds",
    "Wall time of a job, start to last answer.",
    buckets=[0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600],
)
TIME_TO_FIRST_ANSWER = Histogram(
    f"{_PREFIX}_time_to_first_answer_seconds",
    "Time from a job's start to its first final answer.",
    buckets=[0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300],
)
JOBS = Counter(f"{_PREFIX}_jobs", "Jobs ended, by status.", ["status"])
ACTIVE_JOBS = Gauge(f"{_PREFIX}_active_jobs", "Jobs running now.", multiprocess_mode="livesum")
QUEUED_QUESTIONS = Gauge(
    f"{_PREFIX}_queued_questions",
    "Questions of running jobs or open groups without a final answer yet.",
    multiprocess_mode="livesum",
)
IN_FLIGHT_SAMPLES = Gauge(
    f"{_PREFIX}_in_flight_samples",
    "Samples requested from the engine and not yet back.",
    multiprocess_mode="livesum",
)
BUDGET_GRANTED = Counter(f"{_PREFIX}_budget_granted_samples", "Sample budget of jobs started.")
BUDGET_SPENT = Counter(f"{_PREFIX}_budget_spent_samples", "Budget jobs dispatched.")
BUDGET_UNSPENT = Counter(
    f"{_PREFIX}_budget_unspent_samples", "Budget jobs left unspent (settled early or stopped)."
)
PROMPT_TOKENS = Counter(f"{_PREFIX}_prompt_tokens", "Prompt tokens of every sample.")
COMPLETION_TOKENS = Counter(f"{_PREFIX}_completion_tokens", "Completion tokens of every sample.")
UPSTREAM_OUTCOMES = ("dispatched", "completed", "failed", "cancelled")
UPSTREAM_SAMPLES = Counter(
    f"{_PREFIX}_upstream_samples",
    "Samples by upstream and outcome: dispatched, then completed, failed or cancelled "
    "(never made: withdrawn, or missing from an answer with fewer choices than n); "
    "dispatched = completed + failed + cancelled + in flight.",
    ["upstream", "outcome"],
)
UPSTREAM_RETRIES = Counter(
    f"{_PREFIX}_upstream_retries", "Upstream requests retried, by upstream.", ["upstream"]
)
UPSTREAM_LATENCY = Histogram(
    f"{_PREFIX}_upstream_request_duration_seconds",
    "Latency of one successful upstream request (all its samples).",
    ["upstream"],
    buckets=[0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120],
)
ENGINE_STEP = Gauge(
    f"{_PREFIX}_engine_step_seconds",
    "One decode step of the engine at this width (sequences at once), as the cost model "
    "in use says: a profile, refined by the engine's own measurements.",
    ["width"],
    multiprocess_mode="liveall",
)
ENGINE_COST_OBSERVATIONS = Gauge(
    f"{_PREFIX}_engine_cost_observations",
    "The engine's own step-time observations the cost model holds.",
    multiprocess_mode="liveall",
)
UPSTREAM_HEALTHY = Gauge(
    f"{_PREFIX}_upstream_healthy",
    "1 while an upstream takes requests, 0 while it is out.",
    ["upstream"],
    multiprocess_mode="liveall",
)
REQUESTS = Counter(
    f"{_PREFIX}_http_requests", "HTTP requests by route and status.", ["endpoint", "status"]
)
REQUEST_DURATION = Histogram(
    f"{_PREFIX}_http_request_duration_seconds",
    "HTTP request latency by route, streamed bodies included.",
    ["endpoint"],
    buckets=[0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300],
)

# Online self-consistency (the /v1 default): one series per pool label (see
# service/openai/pool_labels.py), removed once no pool has it.
ONLINE_TAU = Gauge(
    f"{_PREFIX}_online_tau",
    "A pool's paced threshold now: the price of a vote where its waves are planned, "
    "else the uncertainty at which its questions stop.",
    ["pool"],
    multiprocess_mode="liveall",
)
ONLINE_MEAN_SAMPLES = Gauge(
    f"{_PREFIX}_online_mean_samples_per_question",
    "Running mean samples per finished question of a pool.",
    ["pool"],
    multiprocess_mode="liveall",
)
ONLINE_PACING_ERROR = Gauge(
    f"{_PREFIX}_online_pacing_error",
    "Running mean samples per question over the pool's budget, minus 1.",
    ["pool"],
    multiprocess_mode="liveall",
)
ONLINE_QUESTIONS = Counter(
    f"{_PREFIX}_online_questions", "Questions a pool answered (paced ones).", ["pool"]
)
ONLINE_ROUNDS = Histogram(
    f"{_PREFIX}_online_rounds_per_question",
    "Waves of engine requests a question of a pool needed.",
    ["pool"],
    buckets=[1, 2, 3, 4, 6, 8, 12, 16, 32, 64],
)

ANSWER_TIMEOUTS = Counter(
    f"{_PREFIX}_answer_timeouts",
    "Samples whose answer ran past its time limit: a regex pattern's (the sample "
    "abstains) or sympy's (the answer keys as text).",
    ["stage"],
)
for _stage in ("regex", "sympy"):
    ANSWER_TIMEOUTS.labels(_stage)

RECORDING_LINES = Counter(
    f"{_PREFIX}_recording_lines",
    "Questions' lines of --record by outcome: written, or lost (a write the disk refused, "
    "or more lines waiting for the disk than the writer holds).",
    ["outcome"],
)

SAMPLES_STOPPED = Counter(
    f"{_PREFIX}_samples_stopped",
    "Samples of answered questions by why they stopped: finished (on their own), settled "
    "(cancelled in flight once their question settled), low_confidence (cut mid-stream by "
    "a trace rule's cut), first_m (cancelled once their wave's first m ended), budget "
    "(cancelled as their job ended or their caller left).",
    ["reason"],
)
for _reason in STOPS:
    SAMPLES_STOPPED.labels(_reason)
CUT_TOKENS = Counter(
    f"{_PREFIX}_cut_tokens",
    "Completion tokens of the samples cut mid-stream for low confidence.",
)

ONLINE_METRICS = (
    ONLINE_TAU,
    ONLINE_MEAN_SAMPLES,
    ONLINE_PACING_ERROR,
    ONLINE_QUESTIONS,
    ONLINE_ROUNDS,
)


def _multiprocess() -> bool:
    return bool(os.environ.get("PROMETHEUS_MULTIPROC_DIR"))


def upstream_configured(upstream: str) -> None:
    """Creates ``upstream``'s labelled series at zero.

    A labelled series exists only once its labels were used: without this, a
    healthy server without retries exports no retry series at all, and
    dashboards show "No data" instead of 0.
    """
    for outcome in UPSTREAM_OUTCOMES:
        UPSTREAM_SAMPLES.labels(upstream, outcome)
    UPSTREAM_RETRIES.labels(upstream)
    UPSTREAM_LATENCY.labels(upstream)


def pool_dropped(pool: str) -> None:
    """Removes the series of the pool label ``pool``.

    Not in multiprocess mode, where a worker's values stay in its files
    (prometheus_client cannot remove them): there the pool labels are
    bounded by their few values alone.
    """
    if _multiprocess():
        return
    for metric in ONLINE_METRICS:
        metric.remove(pool)


def recording_started() -> None:
    """Creates the recording's series at zero (only a recording service exports them)."""
    for outcome in ("written", "lost"):
        RECORDING_LINES.labels(outcome)


def recording_lines(outcome: str, lines: int) -> None:
    """``lines`` of the recording were written, or lost."""
    RECORDING_LINES.labels(outcome).inc(lines)


def exposition() -> bytes:
    """The text format of every metric, merged across workers in multiprocess mode."""
    if _multiprocess():
        registry = CollectorRegistry()
        MultiProcessCollector(registry)  # type: ignore[no-untyped-call]
        return generate_latest(registry)
    return generate_latest(REGISTRY)
