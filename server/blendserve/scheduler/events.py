"""What a job reports: one answer per question, progress, and a summary."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import IntEnum

__all__ = ["AnswerEvent", "Confidence", "DoneEvent", "Event", "JobStatus", "ProgressEvent", "Usage"]


class JobStatus(IntEnum):
    """Lifecycle of a job; everything from COMPLETED on is terminal."""

    PENDING = 0
    RUNNING = 1
    COMPLETED = 2
    FAILED = 3
    CANCELLED = 4

    @property
    def finished(self) -> bool:
        """Whether the job has ended."""
        return self >= JobStatus.COMPLETED


@dataclass
class Usage:
    """Samples and tokens spent; ``reasoning_tokens`` are the completion tokens spent
    thinking, where the upstream counts them (None: no sample's upstream did)."""

    samples: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    reasoning_tokens: int | None = None

    def add(self, other: Usage) -> None:
        """Adds ``other`` into this."""
        self.samples += other.samples
        self.prompt_tokens += other.prompt_tokens
        self.completion_tokens += other.completion_tokens
        if other.reasoning_tokens is not None:
            self.reasoning_tokens = (self.reasoning_tokens or 0) + other.reasoning_tokens


@dataclass(frozen=True)
class Confidence:
    """How sure the vote is: ``asc``, ASC's ``P[p1 < p2]`` (0: certain, 0.5: a coin flip);
    ``ppr``, PPR-1v1's uncertainty (at most ``delta`` settles); ``share``, the winner's share
    of the votes cast."""

    asc: float
    ppr: float
    share: float


@dataclass(frozen=True)
class AnswerEvent:
    """The final answer of one question, the ``index``-th of its job.

    ``key`` is the winner's canonical voting key (``144``), what the service reports
    as ``answer``; ``answer`` is how its first sample wrote it (``144.0``, shown as
    ``answer_text``; None: no sample had one). ``samples`` counts abstentions too;
    ``settled_early``: stopped by ``settle_delta`` before the budget ran out;
    ``partial``: the job failed before the question got all it would have.
    ``completion`` is one completion whose answer won (a reasoning model's final
    answer; its thought is :attr:`reasoning`). ``candidates`` maps every voted key,
    the winner first, then by votes, to its answer and one completion with it;
    ``finish_reasons`` and ``thoughts`` are those completions'. ``abstained`` is the
    last completion with no answer (shown when none had one), with its finish reason
    (``length``: cut at ``max_tokens``) and thought. ``stopped`` is ``truncated`` once
    ``TRUNCATED_LIMIT`` samples since the last vote were cut at ``max_tokens``,
    ``horizon`` when an online pool's wave planner stopped it for want of room, not of
    worth (:meth:`~blendserve.core.programme.VotePrior.past_horizon`), else None.
    ``votes`` are weighted where the job's trace rule weighs them
    (:mod:`blendserve.core.traces`). ``stops`` counts, for each reason of
    :data:`~blendserve.core.traces.STOPS`, the question's samples that stopped for it
    (those cancelled in flight included); ``cut_tokens`` are the completion tokens the
    samples cut mid-stream for low confidence took, part of ``usage``.
    """

    index: int
    id: str
    answer: str | None
    key: str | None
    votes: dict[str, float]
    samples: int
    confidence: Confidence
    settled_early: bool
    completion: str | None
    usage: Usage
    partial: bool = False
    candidates: dict[str, tuple[str, str]] = field(default_factory=dict)
    abstained: str | None = None
    finish_reasons: dict[str, str | None] = field(default_factory=dict)
    abstained_finish_reason: str | None = None
    stopped: str | None = None
    thoughts: dict[str, str] = field(default_factory=dict)
    abstained_thought: str | None = None
    stops: dict[str, int] = field(default_factory=dict)
    cut_tokens: int = 0

    @property
    def reasoning(self) -> str | None:
        """The thought of ``completion``, if it had one."""
        return self.thoughts.get(self.key) if self.key is not None else None


@dataclass(frozen=True)
class ProgressEvent:
    """Where the job stands (sent a few times per second at most)."""

    spent: int
    completed: int
    budget: int
    answered: int
    settled: int
    questions: int


@dataclass(frozen=True)
class DoneEvent:
    """The job's summary, always the last event."""

    status: JobStatus
    budget: int
    spent: int
    usage: Usage
    duration_s: float
    error: str | None = None
    answered: int = 0
    settled: int = 0
    #: Samples in flight cancelled (and refunded) because their question had settled:
    #: the tokens they would have taken are saved.
    cut: int = 0
    #: The engine error that failed the job (its type says which status a client gets).
    cause: BaseException | None = None

    @property
    def unspent(self) -> int:
        """Budget left over (settling ends jobs early)."""
        return self.budget - self.spent


Event = AnswerEvent | ProgressEvent | DoneEvent
