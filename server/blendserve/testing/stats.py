"""A stats sink that records every report, so tests read what one object reported."""

from __future__ import annotations

from collections import Counter
from typing import Any

from blendserve.stats import AnswerStage, Stats, UpstreamOutcome

__all__ = ["RecordingStats"]


class RecordingStats(Stats):
    """Keeps each report as ``(method, args)`` in ``calls``, in order."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, tuple[Any, ...]]] = []

    def of(self, method: str) -> list[tuple[Any, ...]]:
        """The arguments of every ``method`` report, in order."""
        return [args for name, args in self.calls if name == method]

    def level(self, method: str) -> int:
        """The sum of every ``method`` report's first argument (``queued``, ``in_flight``)."""
        return sum(args[0] for args in self.of(method))

    def samples(self, upstream: str) -> Counter[str]:
        """Samples of ``upstream`` by outcome."""
        counts: Counter[str] = Counter()
        for name, outcome, n in self.of("upstream_samples"):
            if name == upstream:
                counts[outcome] += n
        return counts

    def health(self, upstream: str) -> float | None:
        """``upstream``'s last reported health (None: never reported)."""
        reports = [h for name, h in self.of("upstream_health") if name == upstream]
        return reports[-1] if reports else None

    def upstream_configured(self, upstream: str) -> None:
        self.calls.append(("upstream_configured", (upstream,)))

    def upstream_health(self, upstream: str, health: float) -> None:
        self.calls.append(("upstream_health", (upstream, health)))

    def upstream_samples(self, upstream: str, outcome: UpstreamOutcome, samples: int) -> None:
        self.calls.append(("upstream_samples", (upstream, outcome, samples)))

    def upstream_retry(self, upstream: str) -> None:
        self.calls.append(("upstream_retry", (upstream,)))

    def upstream_latency(self, upstream: str, seconds: float) -> None:
        self.calls.append(("upstream_latency", (upstream, seconds)))

    def job_started(self, budget: int) -> None:
        self.calls.append(("job_started", (budget,)))

    def job_ended(self, status: str, seconds: float, spent: int, unspent: int) -> None:
        self.calls.append(("job_ended", (status, seconds, spent, unspent)))

    def first_answer(self, seconds: float) -> None:
        self.calls.append(("first_answer", (seconds,)))

    def queued(self, questions: int) -> None:
        self.calls.append(("queued", (questions,)))

    def in_flight(self, samples: int) -> None:
        self.calls.append(("in_flight", (samples,)))

    def tokens(self, prompt: int, completion: int) -> None:
        self.calls.append(("tokens", (prompt, completion)))

    def answered(self, samples: int, share: float, ppr: float, settled_early: bool) -> None:
        self.calls.append(("answered", (samples, share, ppr, settled_early)))

    def pool_answered(
        self, pool: str, rounds: int, price: float, mean_samples: float, pacing_error: float
    ) -> None:
        self.calls.append(("pool_answered", (pool, rounds, price, mean_samples, pacing_error)))

    def pool_dropped(self, pool: str) -> None:
        self.calls.append(("pool_dropped", (pool,)))

    def answer_timeout(self, stage: AnswerStage) -> None:
        self.calls.append(("answer_timeout", (stage,)))
