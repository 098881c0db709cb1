"""What engines and schedulers report, and to whom: an injected stats sink.

Engines, jobs and pools report to the :class:`Stats` they were given, never to
a metrics library; the base class ignores every report, so the simulator,
library users and tests need no metrics. Reports are plain calls on the event
loop and must not block.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final, Literal

__all__ = ["NO_STATS", "AnswerStage", "JobReport", "Stats", "UpstreamOutcome"]

#: What became of samples asked of an upstream: dispatched, then exactly one of
#: completed (came back), failed, or cancelled (never made: the caller withdrew
#: them, or the upstream answered with fewer choices than asked, as llama.cpp
#: does for ``n``). Per upstream, dispatched = completed + failed + cancelled
#: + those in flight.
UpstreamOutcome = Literal["dispatched", "completed", "failed", "cancelled"]

#: Where a sample's answer can run out of time: a client's ``regex`` pattern
#: (the sample abstains) or a math answer in sympy (it keys as text).
AnswerStage = Literal["regex", "sympy"]


class Stats:
    """A stats sink; every method here does nothing.

    Counts are of samples unless named otherwise; durations are in seconds.
    """

    # -- engines -------------------------------------------------------------

    def upstream_configured(self, upstream: str) -> None:
        """``upstream`` serves this engine (its series exist from now on, at zero)."""

    def upstream_health(self, upstream: str, health: float) -> None:
        """``upstream`` takes requests (1), takes trials only (0.5) or is out (0)."""

    def upstream_samples(self, upstream: str, outcome: UpstreamOutcome, samples: int) -> None:
        """``samples`` asked of ``upstream`` were dispatched, completed, failed or cancelled.

        Each dispatched sample is later reported once more, with its outcome
        (see :data:`UpstreamOutcome`).
        """

    def upstream_retry(self, upstream: str) -> None:
        """A request was retried at ``upstream``."""

    def upstream_latency(self, upstream: str, seconds: float) -> None:
        """A successful request to ``upstream`` took ``seconds`` (all its samples)."""

    def engine_step_cost(self, seconds_by_width: Mapping[int, float], observations: int) -> None:
        """One decode step of the engine takes ``seconds_by_width[w]`` at width ``w``, as the
        cost model in use says (from a profile, and ``observations`` of the engine's own).
        """

    # -- jobs and pools --------------------------------------------------------

    def job_started(self, budget: int) -> None:
        """A job with a budget of ``budget`` samples started."""

    def job_ended(self, status: str, seconds: float, spent: int, unspent: int) -> None:
        """A job ended (``completed``, ``failed`` or ``cancelled``) after ``seconds``."""

    def first_answer(self, seconds: float) -> None:
        """A job's first answer became final ``seconds`` after its start."""

    def queued(self, questions: int) -> None:
        """Questions without a final answer yet changed by ``questions`` (may be negative)."""

    def in_flight(self, samples: int) -> None:
        """Samples requested and not yet back changed by ``samples`` (may be negative)."""

    def tokens(self, prompt: int, completion: int) -> None:
        """A sample came back with ``prompt`` and ``completion`` tokens."""

    def answered(self, samples: int, share: float, ppr: float, settled_early: bool) -> None:
        """A question's answer became final after ``samples`` samples, its winner holding ``share``
        of the votes at PPR-1v1 uncertainty ``ppr``; ``settled_early``: before its budget ran out.
        """

    def samples_stopped(self, stops: Mapping[str, int], cut_tokens: int) -> None:
        """A question's answer became final: ``stops`` counts its samples by why they stopped
        (:data:`~blendserve.core.traces.STOPS`), ``cut_tokens`` the completion tokens of
        those cut mid-stream for low confidence."""

    def pool_answered(
        self, pool: str, rounds: int, price: float, mean_samples: float, pacing_error: float
    ) -> None:
        """A paced question of ``pool`` was answered after ``rounds`` waves of engine requests.

        ``price`` is its client's price now (each client is paced alone; the
        metric keeps its name, ``online_tau``),
        ``mean_samples`` the pool's running mean samples per question (every
        client's), and ``pacing_error`` that mean over the pool's budget, minus 1.
        """

    def pool_dropped(self, pool: str) -> None:
        """No pool reports as ``pool`` any more: its series may go."""

    # -- answers -------------------------------------------------------------

    def answer_timeout(self, stage: AnswerStage) -> None:
        """A sample's answer ran past its time limit at ``stage`` (called from a worker thread)."""


#: The default sink: reports go nowhere.
NO_STATS: Final = Stats()


class JobReport:
    """What one job of ``questions`` and ``budget`` reports to ``sink``: started, each final
    answer, ended (once); ``started`` is on the clock later times come from.
    """

    def __init__(self, sink: Stats, questions: int, budget: int, started: float) -> None:
        self.sink = sink
        self.started = started
        self.unanswered = questions
        self._answered = False
        self._ended = False
        sink.job_started(budget)
        sink.queued(questions)

    def answer(
        self, samples: int, share: float, ppr: float, settled_early: bool, now: float
    ) -> None:
        """A question's answer became final."""
        if not self._answered:
            self._answered = True
            self.sink.first_answer(now - self.started)
        self.sink.answered(samples, share, ppr, settled_early)
        self.sink.queued(-1)
        self.unanswered -= 1

    def end(self, status: str, budget: int, spent: int, now: float) -> None:
        """The job ended (completed, failed or cancelled); later calls do nothing."""
        if self._ended:
            return
        self._ended = True
        self.sink.queued(-self.unanswered)
        self.sink.job_ended(status, now - self.started, spent, budget - spent)
