"""What a job or a pool is given: questions, the request settings and a job's spec."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from blendserve.core.policies import DEFAULT_POLICY, PolicySpec
from blendserve.core.signals import ConfidenceSpec
from blendserve.core.traces import TraceRule
from blendserve.core.waves import DEFAULT_MAX_ROUNDS
from blendserve.engines.base import GenerateRequest, SamplingParams

__all__ = [
    "DEFAULT_CONCURRENCY",
    "DEFAULT_IN_FLIGHT_PER_QUESTION",
    "JobSpec",
    "Keyer",
    "Question",
    "RequestSettings",
]

#: Samples in flight per open question of a job, at most (see :class:`~blendserve.scheduler.Job`).
DEFAULT_IN_FLIGHT_PER_QUESTION = 0.25
#: Samples in flight a job decides sample by sample at most, unless it is given a bound.
DEFAULT_CONCURRENCY = 64

#: ``text -> (extracted answer, canonical key)``, both None when the sample abstains.
Keyer = Callable[[str], Awaitable[tuple[str | None, str | None]]]


class RequestSettings(Protocol):
    """What an engine request of a job or a pool takes from its spec."""

    @property
    def sampling(self) -> SamplingParams: ...
    @property
    def model(self) -> str | None: ...
    @property
    def request_timeout(self) -> float | None: ...
    @property
    def confidence(self) -> ConfidenceSpec | None: ...


@dataclass(frozen=True)
class Question:
    """One question: a plain prompt or chat messages."""

    id: str
    prompt: str | Sequence[int] | None = None
    messages: Sequence[Mapping[str, Any]] | None = None

    def request(self, n: int, first: int, settings: RequestSettings) -> GenerateRequest:
        """The engine request for ``n`` samples, the first being this question's ``first``-th."""
        return GenerateRequest(
            prompt=self.prompt,
            messages=self.messages,
            n=n,
            params=settings.sampling.from_sample(first),
            model=settings.model,
            question_id=self.id,
            timeout=settings.request_timeout,
            confidence=settings.confidence,
        )


@dataclass(frozen=True)
class JobSpec:
    """Everything a job needs besides the engine; ``budget`` is at least one sample a question.

    ``settle_delta`` is the PPR-1v1 error at which a question stops (0: never).
    ``concurrency`` bounds the samples in flight, waves included (None: at most
    :data:`DEFAULT_CONCURRENCY` decided sample by sample, and waves as large as the
    engine has room for). ``in_flight_per_question`` is the latency trade-off: more is
    fewer rounds, fewer is decisions closer to the sequential policy's (see
    :class:`Job`). With a policy that plans waves and an engine with room, a question
    goes in at most ``max_rounds`` waves (0: always sample by sample). ``seed`` seeds
    the policy's tie-break; ``request_timeout`` is per engine request (None: the
    engine's). ``max_consecutive_failures`` engine failures in a row end the job, and
    a streak of transient ones (every upstream down) must also last
    ``failure_timeout`` seconds: that, not ``request_timeout``, bounds how long a job
    outlives its upstreams. ``confidence``: each sample's confidence is read from its
    tokens' logprobs as the spec says (None: no logprobs are asked for). ``traces``: how
    each sample's own signals weigh its vote and cut it (:mod:`blendserve.core.traces`;
    the default counts every vote one and cuts nothing).
    """

    questions: Sequence[Question]
    budget: int
    policy: PolicySpec = field(default_factory=lambda: PolicySpec(DEFAULT_POLICY))
    sampling: SamplingParams = field(default_factory=SamplingParams)
    model: str | None = None
    settle_delta: float = 0.0
    concurrency: int | None = None
    in_flight_per_question: float = DEFAULT_IN_FLIGHT_PER_QUESTION
    max_samples_per_request: int = 16
    max_rounds: int = DEFAULT_MAX_ROUNDS
    seed: int = 0
    request_timeout: float | None = None
    max_consecutive_failures: int = 8
    failure_timeout: float = 5.0
    progress_interval: float = 0.25
    confidence: ConfidenceSpec | None = None
    traces: TraceRule = field(default_factory=TraceRule)
