"""Typed results of the blendserve API."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["Answer", "Budget", "Confidence", "Progress", "SolveResult", "Usage"]


class _Model(BaseModel):
    model_config = ConfigDict(extra="allow")


class Confidence(_Model):
    """How sure a vote is: ASC's P[p1 < p2], PPR-1v1's uncertainty, the winner's share."""

    asc: float
    ppr: float
    share: float


class Usage(_Model):
    """Samples and tokens spent."""

    samples: int
    prompt_tokens: int
    completion_tokens: int
    reasoning_tokens: int | None = None  # of completion_tokens, where the upstream counts them


class Answer(_Model):
    """One question's final answer.

    ``answer`` is the winning key of ``votes`` (``"144"``, None when no sample
    had one); ``answer_text`` is that answer as its first sample wrote it
    (``"144.0"``), for display. A reasoning model's ``completion`` is its
    final answer; with ``include_reasoning``, ``reasoning`` is its thought.
    ``votes`` are weighted under a ``traces`` rule that weighs them; ``stops``
    counts the question's samples by why they stopped (``finished``,
    ``settled``, ``low_confidence``, ``first_m``, ``budget``), and
    ``cut_tokens`` are the tokens of those cut for low confidence.
    """

    index: int
    id: str
    answer: str | None
    answer_text: str | None = None
    votes: dict[str, int | float]
    samples: int
    confidence: Confidence
    settled_early: bool
    completion: str | None
    usage: Usage
    partial: bool = False
    stopped: str | None = None  # "truncated": its samples kept being cut at max_tokens
    reasoning: str | None = None  # with include_reasoning: the completion's thought
    stops: dict[str, int] = Field(default_factory=dict)
    cut_tokens: int = 0


class Budget(_Model):
    """Budget accounting of a job."""

    total: int
    spent: int
    unspent: int


class Progress(_Model):
    """Where a streamed job stands."""

    spent: int
    completed: int
    budget: int
    answered: int
    settled: int
    questions: int


class SolveResult(_Model):
    """A finished job: answers in question order (empty in a stream's last event)."""

    status: Literal["completed", "failed", "cancelled"]
    answers: list[Answer] = []
    usage: Usage
    budget: Budget
    duration_s: float
    error: str | None = None

    def by_id(self) -> dict[str, Answer]:
        """Answers keyed by question id."""
        return {a.id: a for a in self.answers}


class StreamCollector:
    """Keeps a stream's answers, so that its final :class:`SolveResult` holds them all.

    The service's ``done`` event carries the summary only (each answer went
    out once, as it settled); the client's last event is the whole result.
    """

    def __init__(self) -> None:
        self._answers: list[Answer] = []

    def add(self, event: Answer | Progress | SolveResult) -> Answer | Progress | SolveResult:
        """The event to hand on: answers are kept, the summary gets them in question order."""
        if isinstance(event, Answer):
            self._answers.append(event)
        elif isinstance(event, SolveResult) and not event.answers:
            answers = sorted(self._answers, key=lambda a: a.index)
            return event.model_copy(update={"answers": answers})
        return event


def parse_event(name: str, data: dict[str, Any]) -> Answer | Progress | SolveResult:
    """The typed form of one streamed event."""
    if name == "answer":
        return Answer.model_validate(data)
    if name == "progress":
        return Progress.model_validate(data)
    if name == "done":
        return SolveResult.model_validate(data)
    raise ValueError(f"unknown event {name!r}")
