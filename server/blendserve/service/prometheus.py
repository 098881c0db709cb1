"""The service's stats sink: every report of engines, jobs and pools as a Prometheus metric."""

from __future__ import annotations

from collections.abc import Mapping

from blendserve.service import metrics
from blendserve.stats import AnswerStage, Stats, UpstreamOutcome

__all__ = ["PrometheusStats"]


class PrometheusStats(Stats):
    """Updates the metrics of :mod:`blendserve.service.metrics`, served at ``/metrics``."""

    def upstream_configured(self, upstream: str) -> None:
        """Creates ``upstream``'s labelled series at zero."""
        metrics.upstream_configured(upstream)

    def upstream_health(self, upstream: str, health: float) -> None:
        """Sets ``upstream``'s health gauge."""
        metrics.UPSTREAM_HEALTHY.labels(upstream).set(health)

    def upstream_samples(self, upstream: str, outcome: UpstreamOutcome, samples: int) -> None:
        """Counts samples of ``upstream`` by outcome."""
        metrics.UPSTREAM_SAMPLES.labels(upstream, outcome).inc(samples)

    def upstream_retry(self, upstream: str) -> None:
        """Counts a retry at ``upstream``."""
        metrics.UPSTREAM_RETRIES.labels(upstream).inc()

    def upstream_latency(self, upstream: str, seconds: float) -> None:
        """Observes a successful request's latency."""
        metrics.UPSTREAM_LATENCY.labels(upstream).observe(seconds)

    def engine_step_cost(self, seconds_by_width: Mapping[int, float], observations: int) -> None:
        """Sets the step-time gauge at each width and the observation count."""
        for width, seconds in seconds_by_width.items():
            metrics.ENGINE_STEP.labels(str(width)).set(seconds)
        metrics.ENGINE_COST_OBSERVATIONS.set(observations)

    def job_started(self, budget: int) -> None:
        """One more active job; its budget granted."""
        metrics.ACTIVE_JOBS.inc()
        metrics.BUDGET_GRANTED.inc(budget)

    def job_ended(self, status: str, seconds: float, spent: int, unspent: int) -> None:
        """One job less; its status, duration and budget counted."""
        metrics.ACTIVE_JOBS.dec()
        metrics.JOBS.labels(status).inc()
        metrics.JOB_DURATION.observe(seconds)
        metrics.BUDGET_SPENT.inc(spent)
        metrics.BUDGET_UNSPENT.inc(unspent)

    def first_answer(self, seconds: float) -> None:
        """Observes a job's time to its first answer."""
        metrics.TIME_TO_FIRST_ANSWER.observe(seconds)

    def queued(self, questions: int) -> None:
        """Moves the queued questions gauge."""
        metrics.QUEUED_QUESTIONS.inc(questions)

    def in_flight(self, samples: int) -> None:
        """Moves the in-flight samples gauge."""
        metrics.IN_FLIGHT_SAMPLES.inc(samples)

    def tokens(self, prompt: int, completion: int) -> None:
        """Counts a sample's tokens."""
        metrics.PROMPT_TOKENS.inc(prompt)
        metrics.COMPLETION_TOKENS.inc(completion)

    def answered(self, samples: int, share: float, ppr: float, settled_early: bool) -> None:
        """Observes a final answer's samples, vote share and uncertainty."""
        metrics.SAMPLES_PER_QUESTION.observe(samples)
        metrics.ANSWER_VOTE_SHARE.observe(share)
        metrics.ANSWER_PPR_UNCERTAINTY.observe(ppr)
        metrics.ANSWERS.labels(str(settled_early).lower()).inc()

    def samples_stopped(self, stops: Mapping[str, int], cut_tokens: int) -> None:
        """Counts an answered question's samples by why they stopped, and its cut tokens."""
        for reason, samples in stops.items():
            if samples:
                metrics.SAMPLES_STOPPED.labels(reason).inc(samples)
        if cut_tokens:
            metrics.CUT_TOKENS.inc(cut_tokens)

    def pool_answered(
        self, pool: str, rounds: int, price: float, mean_samples: float, pacing_error: float
    ) -> None:
        """Observes the question's rounds and sets the pool's pacing gauges."""
        metrics.ONLINE_ROUNDS.labels(pool).observe(rounds)
        metrics.ONLINE_TAU.labels(pool).set(price)
        metrics.ONLINE_MEAN_SAMPLES.labels(pool).set(mean_samples)
        metrics.ONLINE_PACING_ERROR.labels(pool).set(pacing_error)
        metrics.ONLINE_QUESTIONS.labels(pool).inc()

    def pool_dropped(self, pool: str) -> None:
        """Removes the series of the pool label ``pool``."""
        metrics.pool_dropped(pool)

    def answer_timeout(self, stage: AnswerStage) -> None:
        """Counts a sample whose answer ran past its time limit."""
        metrics.ANSWER_TIMEOUTS.labels(stage).inc()
