"""What a ``/solve`` job may ask, typed once and shared by every client method."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal, TypedDict

from pydantic import BaseModel, ConfigDict, Field, field_validator

__all__ = [
    "AnswerFormat",
    "AnswerKind",
    "QuestionLike",
    "Sampling",
    "SolveFields",
    "SolveOptions",
    "solve_options",
]

#: How a sample's answer is read (the service's docs/policies.md, "Answers").
AnswerKind = Literal["auto", "number", "math", "choice", "regex", "exact"]
#: A plain string is a prompt; a mapping is ``{"id", "prompt" | "messages"}``.
QuestionLike = str | Mapping[str, Any]


class _Options(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class AnswerFormat(_Options):
    """How to read a sample's answer: a kind, and the ``regex`` kind's pattern (first group)."""

    kind: AnswerKind = "auto"
    pattern: str | None = None


class Sampling(_Options):
    """Sampling parameters of every sample, as in the OpenAI and vLLM APIs.

    ``extra`` goes upstream as is (``repetition_penalty``, ...). Fields left
    None are the service's defaults (``temperature`` 0.7).
    """

    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    max_tokens: int | None = None
    stop: str | list[str] | None = None
    seed: int | None = Field(None, description="a question's i-th sample gets seed + i")
    extra: dict[str, Any] | None = None


class SolveOptions(_Options):
    """Everything a job asks besides its questions; None is the service's default.

    Give one of ``budget`` (total samples), ``budget_per_question``, or
    ``confidence`` (a quality target: each question stops once
    ``P[its answer is not the most likely one] <= 1 - confidence``, or at
    ``max_samples_per_question``). ``policy`` is a policy string, ``hedge``
    (the default), ``blend``, ``asc``, ``ppr``, ``esc`` or ``sc`` with options
    (``asc:cap=16``; the grammar is in the service's docs/policies.md).
    ``traces`` is a trace rule (``weighted:measure=auto,cut=10``: how each
    sample's confidence and length weigh its vote and cut it; docs/solve.md).
    ``answer`` takes an :data:`AnswerKind` (``"number"``), ``{"kind",
    "pattern"}`` or an :class:`AnswerFormat`; ``sampling`` a mapping or a
    :class:`Sampling`. The service checks ranges and combinations (a 422
    naming the field). ``include_reasoning`` adds each answer's thought (a
    reasoning model's) as ``Answer.reasoning``.
    """

    budget: int | None = None
    budget_per_question: float | None = None
    confidence: float | None = None
    max_samples_per_question: int | None = Field(None, description="with confidence: the cap")
    policy: str | None = None
    traces: str | None = None
    answer: AnswerFormat | None = None
    sampling: Sampling | None = None
    model: str | None = None
    settle_delta: float | None = Field(None, description="stop a question at this PPR-1v1 error")
    concurrency: int | None = Field(None, description="most samples in flight")
    in_flight_per_question: float | None = Field(
        None, description="samples in flight per open question"
    )
    max_rounds: int | None = Field(
        None, description="waves per question at most (0: sample by sample)"
    )
    include_reasoning: bool | None = Field(
        None, description="each answer carries its completion's thought (a reasoning model's)"
    )

    @field_validator("answer", mode="before")
    @classmethod
    def _answer(cls, value: Any) -> Any:
        return {"kind": value} if isinstance(value, str) else value

    def body(self, questions: Sequence[QuestionLike], *, stream: bool) -> dict[str, Any]:
        """The ``/solve`` body: the set options, each question a ``{"prompt": ...}`` or as given."""
        body: dict[str, Any] = {
            "questions": [{"prompt": q} if isinstance(q, str) else dict(q) for q in questions],
            "stream": stream,
        }
        body.update(self.model_dump(exclude_none=True))
        return body


class SolveFields(TypedDict, total=False):
    """:class:`SolveOptions` as keyword arguments of a client call, for type checkers."""

    budget: int | None
    budget_per_question: float | None
    confidence: float | None
    max_samples_per_question: int | None
    policy: str | None
    traces: str | None
    answer: AnswerKind | AnswerFormat | Mapping[str, Any] | None
    sampling: Sampling | Mapping[str, Any] | None
    model: str | None
    settle_delta: float | None
    concurrency: int | None
    in_flight_per_question: float | None
    max_rounds: int | None
    include_reasoning: bool | None


def solve_options(options: SolveOptions | None, fields: Mapping[str, object]) -> SolveOptions:
    """``options`` with ``fields`` (keyword arguments of a client call) over them.

    Raises:
        pydantic.ValidationError: an unknown field or a value of the wrong type.
    """
    base = options.model_dump(exclude_none=True) if options is not None else {}
    return SolveOptions.model_validate({**base, **fields})
