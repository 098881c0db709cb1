"""The request vocabulary ``/solve`` and ``/v1`` share: answers, messages, sampling, policies.

Both routes' schemas, and the settings, take these from here.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict
from typing import TYPE_CHECKING, Annotated, Any, Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field, WithJsonSchema, field_validator, model_validator
from pydantic_core import PydanticCustomError

from blendserve.core.answers import search_regex
from blendserve.core.policies import PolicySpec, policy_pattern
from blendserve.core.traces import STOPS, TRACE_RULE_PATTERN, parse_trace_rule
from blendserve.engines.base import SEED_MAX, SEED_MIN, SamplingParams
from blendserve.errors import InvalidRequest
from blendserve.service.fields import RequestModel
from blendserve.service.json_depth import deep_field, depth_message
from blendserve.service.json_text import unencodable_field, unencodable_message

if TYPE_CHECKING:
    from blendserve.scheduler import AnswerEvent

__all__ = [
    "POLICY_PATTERN",
    "SERVING_POLICIES",
    "TRACES_DESCRIPTION",
    "TRACE_RULE_PATTERN",
    "AnswerFormat",
    "AnswerKeyOut",
    "AnswerTextOut",
    "ChatMessages",
    "ConfidenceOut",
    "CutTokensOut",
    "SamplingBase",
    "SamplingFields",
    "SamplingIn",
    "StoppedOut",
    "StopsOut",
    "VotesOut",
    "check_extra",
    "check_messages",
    "check_nesting",
    "check_policy",
    "check_text",
    "check_traces",
    "invalid_field",
    "not_null",
    "sampling_params",
    "vote_fields",
]

#: Policies a caller may ask for (the oracle needs the true distributions).
SERVING_POLICIES = ("hedge", "blend", "asc", "ppr", "esc", "sc")
#: The policy strings the OpenAPI schema documents (validation parses them, see check_policy).
POLICY_PATTERN = policy_pattern(SERVING_POLICIES)

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

#: Sampling fields the engine sets itself (its sample accounting depends on them).
_ENGINE_OWNED = ("n", "seed", "stream")


def invalid_field(param: str, message: str) -> PydanticCustomError:
    """A validation error that names the request field at fault (``error.param``)."""
    return PydanticCustomError("invalid_field", "{message}", {"message": message, "param": param})


def check_nesting(data: Any) -> Any:
    """A request body as is, unless it nests too deep: a 422 naming the field.

    For a ``mode="before"`` model validator of a route's body: the check runs on
    the parsed JSON before any field is read (see :mod:`blendserve.service.json_depth`).
    """
    param = deep_field(data)
    if param is not None:
        raise invalid_field(param, depth_message())
    return data


def check_text(data: Any) -> Any:
    """A request body as is, unless a string in it holds a lone surrogate: a 422 naming the field.

    For a ``mode="before"`` model validator of a route's body, after
    :func:`check_nesting`: such a string would fail each upstream request it is
    sent in (see :mod:`blendserve.service.json_text`).
    """
    param = unencodable_field(data)
    if param is not None:
        raise invalid_field(param, unencodable_message())
    return data


def check_traces(value: str) -> str:
    """A trace rule's text (:func:`~blendserve.core.traces.parse_trace_rule`), as given.

    Raises:
        ValueError: an unknown vote or option, or a bad value.
    """
    parse_trace_rule(value)
    return value


#: What a ``traces`` field says, on /solve and /v1 alike.
TRACES_DESCRIPTION = (
    "how each sample's own signals weigh its vote and cut it: count (default: every vote "
    "counts one), weighted or filter, with options measure=tail|mean|lowest_group|length|"
    "auto, keep=0.9 (filter), cut=PERCENTILE (cut a sample mid-stream below the client's "
    "learned bar) and first_m=M (a wave's first M finishers vote, the rest are cancelled), "
    "e.g. weighted:measure=tail,cut=10; a measure that has not shown a signal in the "
    "client's traffic changes nothing"
)


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


def check_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Chat messages as OpenAI takes them: each with a string ``role`` and a ``content``."""
    for message in messages:
        if not isinstance(message.get("role"), str) or "content" not in message:
            raise ValueError("each message needs a string role and a content")
    return messages


def check_extra(extra: Mapping[str, Any], prefix: str = "") -> None:
    """Refuses upstream fields that can never be sent: a retry could not help.

    Raises:
        InvalidRequest: an engine-owned field (``n``, ``seed``,
            ``stream``) or a number that is not finite (JSON has no NaN), with
            ``prefix`` + the field as ``param``.
    """
    for name, value in extra.items():
        if name in _ENGINE_OWNED:
            raise InvalidRequest(
                f"{name} is set by blendserve, not passed upstream", param=prefix + name
            )
        if not _finite(value):
            raise InvalidRequest(
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


def not_null(schema: dict[str, Any], *names: str) -> None:
    """Drops the null branch of optional fields: the schema says to leave them out."""
    for name in names:
        field = schema["properties"][name]
        branches = [b for b in field.pop("anyOf", []) if b.get("type") != "null"]
        field.pop("default", None)
        if len(branches) == 1:
            field.update(branches[0])


def _pattern_with_regex(schema: dict[str, Any]) -> None:
    """Documents "``pattern`` with kind ``regex`` and only then"."""
    not_null(schema, "pattern")
    kinds = [k for k in schema["properties"]["kind"]["enum"] if k != "regex"]
    schema["oneOf"] = [
        {"properties": {"kind": {"const": "regex"}}, "required": ["kind", "pattern"]},
        {"properties": {"kind": {"enum": kinds}}, "not": {"required": ["pattern"]}},
    ]


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


class SamplingFields(Protocol):
    """The sampling fields a request declares (``/solve``'s ``sampling``, ``/v1``'s body)."""

    @property
    def temperature(self) -> float | None: ...
    @property
    def top_p(self) -> float | None: ...
    @property
    def top_k(self) -> int | None: ...
    @property
    def min_p(self) -> float | None: ...
    @property
    def max_tokens(self) -> int | None: ...
    @property
    def stop(self) -> str | list[str] | None: ...
    @property
    def seed(self) -> int | None: ...


def sampling_params(
    fields: SamplingFields,
    extra: Mapping[str, Any],
    *,
    max_tokens: int | None = None,
    temperature: float | None = None,
) -> SamplingParams:
    """The engine-level parameters of a request's declared sampling ``fields``, with ``extra``
    passed upstream as is; ``max_tokens`` and ``temperature`` replace the request's own if given.
    """
    stop = (fields.stop,) if isinstance(fields.stop, str) else fields.stop
    return SamplingParams(
        temperature=temperature if temperature is not None else fields.temperature,
        top_p=fields.top_p,
        top_k=fields.top_k,
        min_p=fields.min_p,
        max_tokens=max_tokens if max_tokens is not None else fields.max_tokens,
        stop=tuple(stop) if stop is not None else None,
        seed=fields.seed,
        extra=dict(extra),
    )


class SamplingBase(RequestModel):
    """The sampling fields ``/solve`` and ``/v1`` share; each declares its own temperature."""

    top_p: float | None = Field(None, gt=0, le=1)
    top_k: int | None = Field(None, ge=-1)
    min_p: float | None = Field(None, ge=0, le=1)
    max_tokens: int | None = Field(None, ge=1, le=1_000_000)
    stop: str | list[str] | None = None
    seed: int | None = Field(
        None,
        ge=SEED_MIN,
        le=SEED_MAX,
        description="64-bit signed; a question's i-th sample gets seed + i (wrapping)",
    )


class SamplingIn(SamplingBase):
    """Sampling parameters, as in the OpenAI and vLLM APIs."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    temperature: float | None = Field(0.7, ge=0, le=2)
    extra: dict[str, Any] = Field(default_factory=dict, description="passed upstream as is")

    @field_validator("extra")
    @classmethod
    def _sendable(cls, value: dict[str, Any]) -> dict[str, Any]:
        check_extra(value)
        return value

    def to_sampling_params(self) -> SamplingParams:
        """The engine-level parameters."""
        return sampling_params(self, self.extra)


class ConfidenceOut(BaseModel):
    """How sure a vote is."""

    asc: float = Field(description="P[p1 < p2] (0: certain, 0.5: a coin flip)")
    ppr: float = Field(description="PPR-1v1 uncertainty; at most settle_delta settles")
    share: float = Field(description="winner's share of the votes")


def vote_fields(event: AnswerEvent) -> dict[str, Any]:
    """How an answer event's question was voted, as both routes report it.

    ``answer`` is the winning voting key, so that it is always a key of
    ``votes``; ``answer_text`` is that answer as its first sample wrote it.
    """
    return {
        "answer": event.key,
        "answer_text": event.answer,
        "votes": _votes_out(event.votes),
        "samples": event.samples,
        "confidence": ConfidenceOut(**asdict(event.confidence)),
        "settled_early": event.settled_early,
        "partial": event.partial,
        "stopped": event.stopped,
        "stops": event.stops,
        "cut_tokens": event.cut_tokens,
    }


def _votes_out(votes: dict[str, float]) -> dict[str, int | float]:
    """Votes as both routes report them: whole counts as integers, weighted ones to 3 decimals."""
    return {k: v if isinstance(v, int) else round(v, 3) for k, v in votes.items()}


#: Each answer's votes, as both routes report them.
VotesOut = Annotated[
    dict[str, int | float],
    Field(
        description="votes per answer key: whole samples, or with a traces rule that weighs "
        "them, each vote's weight summed (to 3 decimals)"
    ),
]
#: Why a question's samples stopped, as both routes report it.
StopsOut = Annotated[
    dict[str, int],
    Field(
        description="the question's samples by why they stopped: "
        + ", ".join(STOPS)
        + " (finished: ended on its own; settled: cancelled in flight once its question "
        "settled or stopped; low_confidence: cut mid-stream by traces' cut; first_m: "
        "cancelled as its wave's first m had ended; budget: cancelled as the job was "
        "cancelled or ended, or its caller left)",
        json_schema_extra={"propertyNames": {"enum": list(STOPS)}},
    ),
]
#: Completion tokens of the samples cut for low confidence, as both routes report them.
CutTokensOut = Annotated[
    int,
    Field(description="completion tokens of the samples cut mid-stream for low confidence"),
]
#: The voted answer, as both routes report it: the winning key of ``votes``.
AnswerKeyOut = Annotated[
    str | None,
    Field(
        description="the winning answer in the form its votes are keyed by: the key of votes "
        'with the most votes (e.g. "144" for samples answering 144, 144.0 or \\boxed{144}); '
        "null when no sample had an answer"
    ),
]
#: The voted answer as a sample wrote it, as both routes report it.
AnswerTextOut = Annotated[
    str | None,
    Field(
        description="the winning answer as the first sample that gave it wrote it (e.g. "
        '"144.0" where answer is "144"): for display only, votes are keyed by answer'
    ),
]
#: Why a question stopped early, as both routes report it.
StoppedOut = Annotated[
    Literal["truncated", "horizon"] | None,
    Field(
        description='why the question stopped early: "truncated" when 3 of its samples since '
        "its last vote were cut at max_tokens (with no vote: answer null, and on /v1 "
        'finish_reason "length"); "horizon" (/v1 online) when its votes reached what the '
        "wave planner can plan while more would still have been worth buying; else null"
    ),
]
