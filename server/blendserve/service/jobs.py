"""What a request runs: the service's engine and job defaults plus the request's own options.

``/solve``, grouped ``/v1`` jobs and the online pools all make their job or
pool here, with :class:`JobMaker`.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Protocol

from blendserve import answers
from blendserve.answers import DEFAULT_REASONING_TAGS, AnswerKeys, AnswerKind, ReasoningTags
from blendserve.core.policies import DEFAULT_POLICY, PolicySpec
from blendserve.core.signals import ConfidenceSpec
from blendserve.core.stopping import DEFAULT_CAP, Score
from blendserve.core.traces import TraceRule, parse_trace_rule
from blendserve.core.waves import DEFAULT_MAX_ROUNDS
from blendserve.engines.base import Engine, SamplingParams
from blendserve.engines.rendering import for_answers
from blendserve.scheduler import Job, JobSpec, Keyer, Question
from blendserve.scheduler.ballots import SampleLog
from blendserve.scheduler.pool import SHARED_CLIENT, Pool, PoolSpec
from blendserve.scheduler.spec import DEFAULT_CONCURRENCY, DEFAULT_IN_FLIGHT_PER_QUESTION
from blendserve.scheduler.traces import TraceLearners
from blendserve.service.settings import Settings
from blendserve.service.vocabulary import AnswerFormat


class AskedOptions(Protocol):
    """What a request may ask of its job: ``/solve``'s body, ``/v1``'s ``blendserve`` object.

    None leaves a field to the defaults :meth:`JobOptions.asked` is given.
    """

    @property
    def policy(self) -> str | None: ...
    @property
    def answer(self) -> AnswerFormat | None: ...
    @property
    def settle_delta(self) -> float | None: ...
    @property
    def max_rounds(self) -> int | None: ...
    @property
    def traces(self) -> str | None: ...


__all__ = ["AskedOptions", "JobDefaults", "JobMaker", "JobOptions"]


@dataclass(frozen=True)
class JobDefaults:
    """The service's side of every job: what a request leaves unset or cannot set.

    ``confidence_logprobs``: the top logprobs each sample's tokens are read with for its
    confidence (0: none asked for; see :meth:`confidence`). ``traces``: the trace rule of
    a request that names none.
    """

    concurrency: int | None = None
    in_flight_per_question: float = DEFAULT_IN_FLIGHT_PER_QUESTION
    max_rounds: int = DEFAULT_MAX_ROUNDS
    request_timeout: float | None = None
    failure_timeout: float = 5.0
    reasoning_tags: ReasoningTags = DEFAULT_REASONING_TAGS
    confidence_logprobs: int = 0
    traces: str = "count"

    def confidence(
        self, max_tokens: int | None, rule: TraceRule | None = None
    ) -> ConfidenceSpec | None:
        """How a request of at most ``max_tokens`` reads its samples' confidence (None:
        not at all): DeepConf's spec with ``confidence_logprobs`` top logprobs, its window
        scaled to the samples' length (:meth:`ConfidenceSpec.scaled`). A trace ``rule``
        that reads confidence has it read with DeepConf's k = 20 where the service reads
        none, so that asking for the rule is enough."""
        if not self.confidence_logprobs:
            if rule is None or not rule.reads_confidence:
                return None
            return ConfidenceSpec().scaled(max_tokens)
        return ConfidenceSpec(self.confidence_logprobs).scaled(max_tokens)

    @classmethod
    def from_settings(cls, settings: Settings) -> JobDefaults:
        """The defaults the service's settings give."""
        return cls(
            concurrency=settings.default_concurrency,
            in_flight_per_question=settings.default_in_flight_per_question,
            max_rounds=settings.default_max_rounds,
            request_timeout=settings.upstream_timeout,
            failure_timeout=settings.job_failure_timeout,
            reasoning_tags=ReasoningTags.parse(settings.reasoning_tags),
            confidence_logprobs=settings.confidence_logprobs,
            traces=settings.traces,
        )


@dataclass(frozen=True)
class JobOptions:
    """What one request asks of its job; None: the service's default."""

    policy: str = DEFAULT_POLICY
    answer_kind: AnswerKind = "auto"
    answer_pattern: str | None = None
    settle_delta: float = 0.0
    sampling: SamplingParams = field(default_factory=SamplingParams)
    model: str | None = None
    concurrency: int | None = None
    in_flight_per_question: float | None = None
    max_rounds: int | None = None
    traces: str | None = None

    @classmethod
    def asked(
        cls,
        asked: AskedOptions,
        sampling: SamplingParams,
        model: str | None,
        *,
        defaults: JobOptions | None = None,
        concurrency: int | None = None,
        in_flight_per_question: float | None = None,
    ) -> JobOptions:
        """The options of a request's job: what it asked, else ``defaults``' (None: these)."""
        base = defaults if defaults is not None else cls()
        answer = asked.answer
        return replace(
            base,
            policy=asked.policy or base.policy,
            answer_kind=answer.kind if answer is not None else base.answer_kind,
            answer_pattern=answer.pattern if answer is not None else base.answer_pattern,
            settle_delta=base.settle_delta if asked.settle_delta is None else asked.settle_delta,
            sampling=sampling,
            model=model,
            concurrency=concurrency,
            in_flight_per_question=in_flight_per_question,
            max_rounds=base.max_rounds if asked.max_rounds is None else asked.max_rounds,
            traces=asked.traces or base.traces,
        )

    def key(self) -> str:
        """Equal for options that may share a job or a pool."""
        return json.dumps(asdict(self), sort_keys=True, default=str)

    def keyer(
        self,
        keys: AnswerKeys | None = None,
        reasoning_tags: ReasoningTags = DEFAULT_REASONING_TAGS,
    ) -> Keyer:
        """A fresh keyer of the options' answer format (arguments as for make_keyer)."""
        return answers.make_keyer(
            self.answer_kind, self.answer_pattern, keys, reasoning_tags=reasoning_tags
        )


@dataclass(frozen=True)
class JobMaker:
    """Makes a request's job or pool: the service's engine, answer keys and defaults.

    Each job or pool gets the engine as its answer format needs it (see
    :func:`~blendserve.engines.rendering.for_answers`) and a keyer of its own;
    each client of a pool gets one too. ``keys`` holds the answer keys' workers
    and cache (None: the module's default). ``log`` takes every question's samples,
    of every job and pool made here (None: they are not kept). ``learners`` keeps what
    each (client, model)'s traces taught, across its requests.
    """

    engine: Engine
    defaults: JobDefaults = field(default_factory=JobDefaults)
    keys: AnswerKeys | None = None
    log: SampleLog | None = None
    learners: TraceLearners = field(default_factory=TraceLearners)

    def rule(self, options: JobOptions) -> TraceRule:
        """The trace rule ``options`` asked for, else the service's."""
        return parse_trace_rule(options.traces or self.defaults.traces)

    def keyer(self, options: JobOptions) -> Keyer:
        """A fresh keyer of ``options``' answer format, reading the service's thought tags."""
        return options.keyer(self.keys, self.defaults.reasoning_tags)

    def _parts(self, options: JobOptions) -> tuple[Engine, Keyer]:
        return for_answers(self.engine, options.answer_kind), self.keyer(options)

    def job(
        self,
        options: JobOptions,
        questions: Sequence[Question],
        budget: int,
        client: str = SHARED_CLIENT,
    ) -> Job:
        """A budgeted job of ``questions``, its traces learned as ``client``'s."""
        defaults = self.defaults
        rule = self.rule(options)
        spec = JobSpec(
            questions=questions,
            budget=budget,
            policy=PolicySpec.parse(options.policy),
            sampling=options.sampling,
            model=options.model,
            settle_delta=options.settle_delta,
            concurrency=options.concurrency or defaults.concurrency,
            in_flight_per_question=options.in_flight_per_question
            or defaults.in_flight_per_question,
            max_rounds=defaults.max_rounds if options.max_rounds is None else options.max_rounds,
            request_timeout=defaults.request_timeout,
            failure_timeout=defaults.failure_timeout,
            confidence=defaults.confidence(options.sampling.max_tokens, rule),
            traces=rule,
        )
        learner = self.learners.get(client, options.model) if rule.learns else None
        return Job(spec, *self._parts(options), log=self.log, learner=learner)

    def pool(
        self,
        options: JobOptions,
        name: str,
        *,
        budget_per_question: float | None,
        target: float | None = None,
        score: Score = "asc",
        cap: float = DEFAULT_CAP,
        max_cap: int = 64,
    ) -> Pool:
        """A pool paced to ``budget_per_question``, or of a fixed ``target``; ``name`` labels it.
        Each client's traces are learned as its own for the options' model."""
        rule = self.rule(options)
        spec = PoolSpec(
            budget_per_question=budget_per_question,
            target=target,
            sampling=options.sampling,
            model=options.model,
            score=score,
            cap=cap,
            max_cap=max_cap,
            concurrency=options.concurrency or self.defaults.concurrency or DEFAULT_CONCURRENCY,
            max_rounds=self.defaults.max_rounds
            if options.max_rounds is None
            else options.max_rounds,
            request_timeout=self.defaults.request_timeout,
            failure_timeout=self.defaults.failure_timeout,
            confidence=self.defaults.confidence(options.sampling.max_tokens, rule),
            traces=rule,
        )
        engine, keyer = self._parts(options)
        model = options.model
        return Pool(
            spec,
            engine,
            keyer,
            name,
            client_keyer=lambda: self.keyer(options),
            log=self.log,
            learner_of=lambda client: self.learners.get(client, model),
        )
