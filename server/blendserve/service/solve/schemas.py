"""Request and response bodies of ``POST /solve``."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    WithJsonSchema,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from blendserve.core.answers import search_regex
from blendserve.core.policies import PolicySpec
from blendserve.engines.base import SamplingParams
from blendserve.errors import RequestValidationError
from blendserve.service.fields import RequestModel

__all__ = [
    "AnswerFormat",
    "AnswerOut",
    "BudgetOut",
    "ChatMessages",
    "ConfidenceOut",
    "QuestionIn",
    "SamplingIn",
    "SolveRequest",
    "SolveResponse",
    "UsageOut",
    "check_extra",
    "check_messages",
    "check_policy",
]

#: Policies a caller may ask for (the oracle needs the true distributions).
SERVING_POLICIES = ("blend", "asc", "ppr", "esc", "sc")
#: The policy strings the OpenAPI schema documents (validation parses them, see check_policy).
_POLICY_OPTION = r"(cap=([0-9]+(\.[0-9]+)?|none)|window=[0-9]+|settle_delta=0(\.[0-9]+)?)"
POLICY_PATTERN = rf"^(blend|asc|ppr|esc|sc)(:{_POLICY_OPTION}(,{_POLICY_OPTION})*)?$"

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

#: Chat messages as OpenAI takes them; validated by check_messages.
ChatMessages = Annotated[
    list[dict[str, Any]],
    WithJsonSchema(
        {
            "type": "array",
            "minItems": 1,
            "items": {
                "type": "object",
                "required": ["role", "content"],
                "properties": {"role": {"type": "string"}},
            },
        }
    ),
]


def check_policy(value: str) -> str:
    """A policy string a job can run: a serving policy with valid options.

    Raises:
        ValueError: unknown policy, or bad options (``cap=0``, ``window=0``, ``cap=nan``).
    """
    spec = PolicySpec.parse(value)
    if spec.name not in SERVING_POLICIES:
        raise ValueError(f"policy {spec.name!r} cannot serve (use {', '.join(SERVING_POLICIES)})")
    spec.build(1, 1)  # the policy's own checks of its options
    return value


#: Sampling fields the engine sets itself (its sample accounting depends on them).
_ENGINE_OWNED = ("n", "seed", "stream")


def check_extra(extra: Mapping[str, Any], prefix: str = "") -> None:
    """Refuses upstream fields that can never be sent: a retry could not help.

    Raises:
        RequestValidationError: an engine-owned field (``n``, ``seed``,
            ``stream``) or a number that is not finite (JSON has no NaN), with
            ``prefix`` + the field as ``param``.
    """
    for name, value in extra.items():
        if name in _ENGINE_OWNED:
            raise RequestValidationError(
                f"{name} is set by blendserve, not passed upstream", param=prefix + name
            )
        if not _finite(value):
            raise RequestValidationError(
                f"{name}: numbers must be finite (no NaN or Infinity)", param=prefix + name
            )


def _finite(value: Any) -> bool:
    pending = [value]  # a stack, not recursion: JSON may nest deeper than Python recurses
    while pending:
        item = pending.pop()
        if isinstance(item, float) and not math.isfinite(item):
            return False
        if isinstance(item, dict):
            pending.extend(item.values())
        elif isinstance(item, list):
            pending.extend(item)
    return True


def _not_null(schema: dict[str, Any], *names: str) -> None:
    """Drops the null branch of optional fields: the schema says to leave them out."""
    for name in names:
        field = schema["properties"][name]
        branches = [b for b in field.pop("anyOf", []) if b.get("type") != "null"]
        field.pop("default", None)
        if len(branches) == 1:
            field.update(branches[0])


def _exactly_one_of(*names: str) -> Callable[[dict[str, Any]], None]:
    """Documents "exactly one of ``names``" in a model's JSON schema."""

    def extra(schema: dict[str, Any]) -> None:
        _not_null(schema, *names)
        schema["oneOf"] = [{"required": [name]} for name in names]

    return extra


def _budget_or_target(schema: dict[str, Any]) -> None:
    """Documents "``budget``, ``budget_per_question`` or ``confidence``, each with its fields"."""
    _not_null(schema, *_BUDGET_FIELDS[:2], "confidence", "max_samples_per_question")
    no_cap = {"not": {"required": ["max_samples_per_question"]}}
    schema["oneOf"] = [
        {"required": ["budget"], **no_cap},
        {"required": ["budget_per_question"], **no_cap},
        {
            "required": ["confidence"],
            "not": {"anyOf": [{"required": [name]} for name in _BUDGET_FIELDS]},
        },
    ]


def _pattern_with_regex(schema: dict[str, Any]) -> None:
    """Documents "``pattern`` with kind ``regex`` and only then"."""
    _not_null(schema, "pattern")
    kinds = [k for k in schema["properties"]["kind"]["enum"] if k != "regex"]
    schema["oneOf"] = [
        {"properties": {"kind": {"const": "regex"}}, "required": ["kind", "pattern"]},
        {"properties": {"kind": {"enum": kinds}}, "not": {"required": ["pattern"]}},
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


def check_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Chat messages as OpenAI takes them: each with a string ``role`` and a ``content``."""
    for message in messages:
        if not isinstance(message.get("role"), str) or "content" not in message:
            raise ValueError("each message needs a string role and a content")
    return messages


class AnswerFormat(BaseModel):
    """How to extract the answer that votes."""

    model_config = ConfigDict(extra="forbid", json_schema_extra=_pattern_with_regex)

    kind: Literal["auto", "number", "math", "choice", "regex", "exact"] = "auto"
    pattern: str | None = Field(
        None, min_length=1, max_length=1000, description="regex kind: first group"
    )

    @model_validator(mode="after")
    def _pattern_for_regex(self) -> AnswerFormat:
        if (self.kind == "regex") != (self.pattern is not None):
            raise ValueError("pattern is required with kind regex and only then")
        if self.pattern is not None:
            search_regex("", self.pattern)  # a pattern that does not compile is a ValueError
        return self


class SamplingIn(RequestModel):
    """Sampling parameters, as in the OpenAI and vLLM APIs."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    temperature: float | None = Field(0.7, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    top_k: int | None = Field(None, ge=-1)
    min_p: float | None = Field(None, ge=0, le=1)
    max_tokens: int | None = Field(None, ge=1, le=1_000_000)
    stop: str | list[str] | None = None
    seed: int | None = None
    extra: dict[str, Any] = Field(default_factory=dict, description="passed upstream as is")

    @field_validator("extra")
    @classmethod
    def _sendable(cls, value: dict[str, Any]) -> dict[str, Any]:
        check_extra(value)
        return value

    def to_sampling_params(self) -> SamplingParams:
        """The engine-level parameters."""
        stop = (self.stop,) if isinstance(self.stop, str) else self.stop
        return SamplingParams(
            temperature=self.temperature,
            top_p=self.top_p,
            top_k=self.top_k,
            min_p=self.min_p,
            max_tokens=self.max_tokens,
            stop=tuple(stop) if stop is not None else None,
            seed=self.seed,
            extra=dict(self.extra),
        )


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
        "blend",
        description="blend, asc, ppr, esc or sc; options as asc:cap=16",
        json_schema_extra={"pattern": POLICY_PATTERN},
    )
    answer: AnswerFormat = Field(default_factory=AnswerFormat)
    sampling: SamplingIn = Field(default_factory=SamplingIn)
    model: str | None = None
    settle_delta: float = Field(0.0, ge=0, lt=1, description="0: pure Blend-ASC")
    concurrency: int | None = Field(None, ge=1, le=4096, description="most samples in flight")
    in_flight_per_question: float | None = Field(
        None,
        gt=0,
        le=64,
        description=(
            "samples in flight per open question, at most (default 0.5): more means fewer "
            "rounds, fewer means decisions closer to the sequential policy's"
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
    stream: bool = False

    @field_validator("policy")
    @classmethod
    def _known_policy(cls, value: str) -> str:
        return check_policy(value)

    @model_validator(mode="after")
    def _budget(self) -> SolveRequest:
        if self.confidence is not None:
            # A quality target spends what each question needs: no budget to split.
            for name in _BUDGET_FIELDS:
                if name in self.model_fields_set:
                    raise PydanticCustomError(
                        "invalid_field",
                        "{message}",
                        {"message": f"{name} does not go with confidence", "param": name},
                    )
            return self
        if self.max_samples_per_question is not None:
            raise PydanticCustomError(
                "invalid_field",
                "{message}",
                {
                    "message": "max_samples_per_question goes with confidence only",
                    "param": "max_samples_per_question",
                },
            )
        if (self.budget is None) == (self.budget_per_question is None):
            raise ValueError("give exactly one of budget and budget_per_question")
        if self.total_budget < len(self.questions):
            raise ValueError(
                f"budget {self.total_budget} is below one sample per question "
                f"({len(self.questions)} questions)"
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


class ConfidenceOut(BaseModel):
    """How sure a vote is."""

    asc: float = Field(description="P[p1 < p2] (0: certain, 0.5: a coin flip)")
    ppr: float = Field(description="PPR-1v1 uncertainty; at most settle_delta settles")
    share: float = Field(description="winner's share of the votes")


class UsageOut(BaseModel):
    """Samples and tokens spent."""

    samples: int
    prompt_tokens: int
    completion_tokens: int


class AnswerOut(BaseModel):
    """One question's final answer."""

    index: int
    id: str
    answer: str | None
    votes: dict[str, int]
    samples: int
    confidence: ConfidenceOut
    settled_early: bool
    completion: str | None
    usage: UsageOut
    partial: bool = False


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
