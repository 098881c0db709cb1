"""Request and response bodies of ``POST /solve``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from blendserve.core.policies import DEFAULT_POLICY
from blendserve.service.fields import RequestModel
from blendserve.service.vocabulary import (
    POLICY_PATTERN,
    TRACE_RULE_PATTERN,
    TRACES_DESCRIPTION,
    AnswerFormat,
    AnswerKeyOut,
    AnswerTextOut,
    ChatMessages,
    ConfidenceOut,
    CutTokensOut,
    SamplingIn,
    StoppedOut,
    StopsOut,
    VotesOut,
    check_messages,
    check_nesting,
    check_policy,
    check_text,
    check_traces,
    invalid_field,
    not_null,
)

__all__ = [
    "AnswerOut",
    "BudgetOut",
    "ConfidenceOut",
    "QuestionIn",
    "SolveRequest",
    "SolveResponse",
    "UsageOut",
]

#: With a quality target: the default cap per question (as /v1's).
DEFAULT_MAX_SAMPLES = 64
#: Fields of a budgeted batch that a quality target leaves without meaning.
_BUDGET_FIELDS = (
    "budget",
    "budget_per_question",
    "policy",
    "settle_delta",
    "in_flight_per_question",
)


def _exactly_one_of(*names: str) -> Callable[[dict[str, Any]], None]:
    """Documents "exactly one of ``names``" in a model's JSON schema."""

    def extra(schema: dict[str, Any]) -> None:
        not_null(schema, *names)
        schema["oneOf"] = [{"required": [name]} for name in names]

    return extra


def _budget_or_target(schema: dict[str, Any]) -> None:
    """Documents "``budget``, ``budget_per_question`` or ``confidence``, each with its fields"."""
    not_null(schema, *_BUDGET_FIELDS[:2], "confidence", "max_samples_per_question")
    no_cap = {"not": {"required": ["max_samples_per_question"]}}
    schema["oneOf"] = [
        {"required": ["budget"], **no_cap},
        {"required": ["budget_per_question"], **no_cap},
        {
            "required": ["confidence"],
            "not": {"anyOf": [{"required": [name]} for name in _BUDGET_FIELDS]},
        },
    ]


class QuestionIn(BaseModel):
    """One question: ``prompt`` (completions) or ``messages`` (chat)."""

    model_config = ConfigDict(
        extra="forbid", json_schema_extra=_exactly_one_of("prompt", "messages")
    )

    id: str | None = Field(None, max_length=256, description="echoed back; default: its index")
    prompt: str | None = Field(None, min_length=1)
    messages: ChatMessages | None = Field(None, min_length=1)

    @model_validator(mode="after")
    def _one_of(self) -> QuestionIn:
        if (self.prompt is None) == (self.messages is None):
            raise ValueError("give exactly one of prompt and messages")
        check_messages(self.messages or [])
        return self


class SolveRequest(RequestModel):
    """A batch of questions sharing one sample budget."""

    model_config = ConfigDict(
        extra="forbid",
        allow_inf_nan=False,
        json_schema_extra=_budget_or_target,
    )

    questions: list[QuestionIn] = Field(min_length=1)
    budget: int | None = Field(None, ge=1, description="total samples for the batch")
    budget_per_question: float | None = Field(
        None, gt=0, le=1_000_000, description="budget / questions"
    )
    policy: str = Field(
        DEFAULT_POLICY,
        description="hedge (default), blend (Blend-ASC), asc, ppr, esc or sc; options: asc:cap=16",
        json_schema_extra={"pattern": POLICY_PATTERN},
    )
    traces: str | None = Field(
        None,
        description=TRACES_DESCRIPTION + " (default: the server's --traces)",
        json_schema_extra={"pattern": TRACE_RULE_PATTERN},
    )
    answer: AnswerFormat = Field(default_factory=AnswerFormat)
    sampling: SamplingIn = Field(default_factory=SamplingIn)
    model: str | None = None
    settle_delta: float = Field(0.0, ge=0, lt=1, description="0: pure Blend-ASC")
    concurrency: int | None = Field(
        None, ge=1, le=4096, description="most samples in flight, waves included"
    )
    in_flight_per_question: float | None = Field(
        None,
        gt=0,
        le=64,
        description=(
            "samples in flight per open question, at most (default 0.25): more means fewer "
            "rounds, fewer means decisions closer to the sequential policy's"
        ),
    )
    max_rounds: int | None = Field(
        None,
        ge=0,
        le=64,
        description=(
            "waves per question at most (default 4): a job on an engine with room sends a "
            "few large requests, each question's last taking all it is expected to need; "
            "0: sample by sample (more rounds, the sequential policy's decisions)"
        ),
    )
    confidence: float | None = Field(
        None,
        gt=0.5,
        lt=1,
        description=(
            "quality target instead of a budget: each question stops once P[its answer is "
            "not the most likely one] <= 1 - confidence, or at max_samples_per_question"
        ),
    )
    max_samples_per_question: int | None = Field(
        None, ge=1, le=1_000_000, description="with confidence: the cap (default 64)"
    )
    include_reasoning: bool = Field(
        False,
        description="add each answer's reasoning: the thought of its completion (a reasoning "
        "model's; null where it had none)",
    )
    stream: bool = False

    @model_validator(mode="before")
    @classmethod
    def _not_too_deep_nor_unencodable(cls, data: Any) -> Any:
        return check_text(check_nesting(data))

    @field_validator("policy")
    @classmethod
    def _known_policy(cls, value: str) -> str:
        return check_policy(value)

    @field_validator("traces")
    @classmethod
    def _known_traces(cls, value: str | None) -> str | None:
        return check_traces(value) if value is not None else None

    @model_validator(mode="after")
    def _budget(self) -> SolveRequest:
        if self.confidence is not None:
            # A quality target spends what each question needs: no budget to split.
            for name in _BUDGET_FIELDS:
                if name in self.model_fields_set:
                    raise invalid_field(name, f"{name} does not go with confidence")
            return self
        if self.max_samples_per_question is not None:
            raise invalid_field(
                "max_samples_per_question", "max_samples_per_question goes with confidence only"
            )
        if (self.budget is None) == (self.budget_per_question is None):
            raise ValueError("give exactly one of budget and budget_per_question")
        if self.total_budget < len(self.questions):
            raise invalid_field(
                "budget" if self.budget is not None else "budget_per_question",
                f"budget {self.total_budget} is below one sample per question "
                f"({len(self.questions)} questions)",
            )
        return self

    @property
    def cap(self) -> int:
        """With ``confidence``: the most samples a question may take."""
        return self.max_samples_per_question or DEFAULT_MAX_SAMPLES

    @property
    def total_budget(self) -> int:
        """The budget in samples (with ``confidence``: the cap times the questions)."""
        if self.confidence is not None:
            return self.cap * len(self.questions)
        if self.budget is not None:
            return self.budget
        assert self.budget_per_question is not None
        return round(self.budget_per_question * len(self.questions))


class UsageOut(BaseModel):
    """Samples and tokens spent."""

    samples: int
    prompt_tokens: int
    completion_tokens: int
    reasoning_tokens: int | None = Field(
        None,
        description="of the completion tokens, those spent thinking, where the upstream "
        "counts them (null: it does not)",
    )


class AnswerOut(BaseModel):
    """One question's final answer."""

    index: int
    id: str
    answer: AnswerKeyOut
    answer_text: AnswerTextOut = None
    votes: VotesOut
    samples: int
    confidence: ConfidenceOut
    settled_early: bool
    completion: str | None = Field(
        description="a sample whose answer won (a reasoning model's: its final answer, "
        "without the thought)"
    )
    usage: UsageOut
    partial: bool = False
    stopped: StoppedOut = None
    stops: StopsOut = Field(default_factory=dict)
    cut_tokens: CutTokensOut = 0
    reasoning: str | None = Field(
        None,
        description="with include_reasoning: the thought of completion (null where it had "
        "none, and without include_reasoning)",
    )


class BudgetOut(BaseModel):
    """Budget accounting of a job."""

    total: int
    spent: int
    unspent: int


class SolveResponse(BaseModel):
    """All answers (in question order) and the job's summary."""

    status: Literal["completed", "failed", "cancelled"]
    answers: list[AnswerOut]
    usage: UsageOut
    budget: BudgetOut
    duration_s: float
    error: str | None = None
