"""Request and response bodies of the OpenAI-compatible routes.

Requests accept OpenAI's fields, vLLM's extra sampling fields (anything not
declared here is passed upstream as is) and an extra object ``blendserve``
with the self-consistency settings of the request.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from blendserve.engines.base import SamplingParams
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
    SamplingBase,
    StoppedOut,
    StopsOut,
    VotesOut,
    check_messages,
    check_nesting,
    check_policy,
    check_text,
    check_traces,
    invalid_field,
    sampling_params,
)

__all__ = [
    "THOUGHT_FIELDS",
    "BlendserveOptions",
    "ChatCompletion",
    "ChatCompletionRequest",
    "Completion",
    "CompletionRequest",
    "PromptInput",
    "VoteOut",
    "thought_fields",
]

#: One prompt of ``/v1/completions``: text or token ids.
PromptInput = str | list[int]

#: Fields whose meaning self-consistency cannot keep (turn it off to use them).
UNSUPPORTED_WITH_SC = (
    "logprobs", "top_logprobs", "echo", "best_of", "suffix", "tools", "tool_choice",
    "functions", "function_call",
)  # fmt: skip


def _token_ids(value: object, param: str) -> None:
    if not isinstance(value, list) or not value:
        raise invalid_field(param, "token ids must be a non-empty list of integers")
    for j, token in enumerate(value):
        if isinstance(token, bool) or not isinstance(token, int) or token < 0:
            raise invalid_field(f"{param}.{j}", "a token id must be an integer >= 0")


class BlendserveOptions(RequestModel):
    """Per-request self-consistency settings; unset fields take the server's defaults."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    enabled: bool = Field(True, description="false: pass the request upstream unchanged")
    budget_per_question: float | None = Field(None, gt=0, le=100_000)
    policy: str | None = Field(
        None,
        description="blend, asc, ppr, esc or sc; options: asc:cap=16",
        json_schema_extra={"pattern": POLICY_PATTERN},
    )
    answer: AnswerFormat | None = None
    traces: str | None = Field(
        None,
        description=TRACES_DESCRIPTION + " (default: the server's --traces)",
        json_schema_extra={"pattern": TRACE_RULE_PATTERN},
    )
    settle_delta: float | None = Field(None, ge=0, lt=1)
    max_rounds: int | None = Field(
        None,
        ge=0,
        le=64,
        description="waves per question at most (0: sample by sample; default: the server's)",
    )
    confidence: float | None = Field(
        None,
        gt=0.5,
        lt=1,
        description="quality target instead of a budget: stop each question once "
        "P[its answer is not the most likely one] <= 1 - confidence",
    )

    @field_validator("answer", mode="before")
    @classmethod
    def _kind_alone(cls, value: object) -> object:
        return {"kind": value} if isinstance(value, str) else value

    @field_validator("policy")
    @classmethod
    def _serving_policy(cls, value: str | None) -> str | None:
        return check_policy(value) if value is not None else None

    @field_validator("traces")
    @classmethod
    def _known_traces(cls, value: str | None) -> str | None:
        return check_traces(value) if value is not None else None


class StreamOptions(RequestModel):
    """OpenAI's ``stream_options``."""

    include_usage: bool = False


class _Request(SamplingBase):
    """Fields both completion routes share."""

    model_config = ConfigDict(extra="allow", allow_inf_nan=False)

    model: str | None = Field(None, max_length=512)
    n: int = Field(1, ge=1, le=128, description="choices: the n most-voted distinct answers")
    stream: bool = False
    stream_options: StreamOptions | None = None
    temperature: float | None = Field(None, ge=0, le=2)
    blendserve: BlendserveOptions = Field(default_factory=BlendserveOptions)

    @model_validator(mode="before")
    @classmethod
    def _not_too_deep_nor_unencodable(cls, data: Any) -> Any:
        return check_text(check_nesting(data))

    @model_validator(mode="after")
    def _sc_compatible(self) -> _Request:
        if self.blendserve.enabled:
            extra = self.model_extra or {}
            for name in UNSUPPORTED_WITH_SC:
                value = extra.get(name)
                if value not in (None, False) and not (name == "best_of" and value == 1):
                    raise invalid_field(
                        name,
                        f"{name} is not supported with self-consistency: voting needs "
                        "generated answers (set blendserve.enabled to false to pass the "
                        "request upstream)",
                    )
        return self

    @property
    def include_usage(self) -> bool:
        """Whether a stream ends with a usage chunk."""
        return self.stream_options is not None and self.stream_options.include_usage

    def sampling(
        self, max_tokens: int | None = None, temperature: float | None = None
    ) -> SamplingParams:
        """The sampling parameters of every sample; undeclared fields go upstream as is.

        ``max_tokens`` and ``temperature`` replace the request's own when given.
        """
        extra = {
            k: v
            for k, v in (self.model_extra or {}).items()
            if k not in UNSUPPORTED_WITH_SC and k != "max_completion_tokens"
        }
        return sampling_params(self, extra, max_tokens=max_tokens, temperature=temperature)


class ChatCompletionRequest(_Request):
    """``POST /v1/chat/completions``."""

    messages: ChatMessages = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1, le=1_000_000)

    @field_validator("messages")
    @classmethod
    def _messages(cls, value: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return check_messages(value)

    @property
    def token_limit(self) -> int | None:
        """``max_completion_tokens``, else ``max_tokens``."""
        return self.max_completion_tokens or self.max_tokens


class CompletionRequest(_Request):
    """``POST /v1/completions``: one question per prompt, given as text or token ids."""

    prompt: str | list[str] | list[int] | list[list[int]] = Field(
        description="a prompt (text or token ids) or a batch of them, one question each"
    )

    @field_validator("prompt", mode="before")
    @classmethod
    def _prompt_shape(cls, value: object) -> object:
        if isinstance(value, str):
            return value
        if not isinstance(value, list) or not value:
            raise invalid_field(
                "prompt", "prompt must be a string, token ids, or a non-empty list of either"
            )
        if isinstance(value[0], str):
            for i, item in enumerate(value):
                if not isinstance(item, str):
                    raise invalid_field(f"prompt.{i}", "a batch of text prompts holds strings only")
        elif isinstance(value[0], list):
            for i, item in enumerate(value):
                _token_ids(item, f"prompt.{i}")
        else:
            _token_ids(value, "prompt")
        return value

    @model_validator(mode="after")
    def _non_empty(self) -> CompletionRequest:
        if self.blendserve.enabled:
            for i, prompt in enumerate(self.prompts):
                if not prompt:
                    param = f"prompt.{i}" if self.batched else "prompt"
                    raise invalid_field(param, "an empty prompt has nothing to answer")
        return self

    @property
    def batched(self) -> bool:
        """Whether ``prompt`` is a list of prompts (choices ``i*n ...`` answer prompt ``i``)."""
        return isinstance(self.prompt, list) and isinstance(self.prompt[0], (str, list))

    @property
    def prompts(self) -> list[PromptInput]:
        """Each prompt of the batch, as text or token ids."""
        if self.batched:
            return list(self.prompt)  # type: ignore[arg-type]
        return [self.prompt]  # type: ignore[list-item]


#: A sample's thought in a reply, as vLLM's reasoning parser writes it: ``reasoning``,
#: and ``reasoning_content`` (its older name) for clients that read that one.
THOUGHT_FIELDS = ("reasoning", "reasoning_content")


def thought_fields(reasoning: str | None) -> dict[str, str]:
    """A message's (or choice's, or delta's) thought fields: none when it had no thought.

    Present only with a thought, so a model that does not think gets replies as
    before; OpenAI's clients read them as extra fields.
    """
    return {} if reasoning is None else dict.fromkeys(THOUGHT_FIELDS, reasoning)


def _documents_thought(schema: dict[str, Any]) -> None:
    """Documents the thought fields a body carries only when there is a thought."""
    thought = "a reasoning model's thought before its final answer (absent without one)"
    schema["properties"]["reasoning"] = {"type": "string", "description": thought}
    schema["properties"]["reasoning_content"] = {
        "type": "string",
        "description": f"{thought}: reasoning, under its older name",
    }


def _documents_token_details(schema: dict[str, Any]) -> None:
    schema["properties"]["completion_tokens_details"] = {
        "type": "object",
        "properties": {"reasoning_tokens": {"type": "integer"}},
        "required": ["reasoning_tokens"],
        "description": "completion tokens spent thinking, where the upstream counts them "
        "(absent where it does not)",
    }


class UsageInfo(BaseModel):
    """OpenAI's ``usage``: tokens of every sample spent on the request's questions.

    ``completion_tokens_details.reasoning_tokens`` is there where the upstream
    counts a thought's tokens (see :func:`~blendserve.service.openai.render.usage_of`).
    """

    model_config = ConfigDict(extra="allow", json_schema_extra=_documents_token_details)

    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class VoteOut(BaseModel):
    """How one question's answer was voted."""

    answer: AnswerKeyOut
    answer_text: AnswerTextOut = None
    votes: VotesOut
    samples: int
    confidence: ConfidenceOut
    settled_early: bool
    partial: bool
    temperature: float | None = Field(
        description="temperature the samples were drawn at (null: the upstream's default); "
        "a greedy request (temperature 0) gets one sample unless the server samples it "
        "at --sc-greedy-temperature"
    )
    stopped: StoppedOut = None
    stops: StopsOut = Field(default_factory=dict)
    cut_tokens: CutTokensOut = 0


class ChatMessageOut(BaseModel):
    """The assistant's message: the final answer in ``content``; :func:`thought_fields`."""

    model_config = ConfigDict(extra="allow", json_schema_extra=_documents_thought)

    role: Literal["assistant"] = "assistant"
    content: str


class ChatChoice(BaseModel):
    """One choice of a chat completion."""

    index: int
    message: ChatMessageOut
    finish_reason: str | None
    logprobs: None = None


class ChatCompletion(BaseModel):
    """OpenAI's ``chat.completion`` with the vote in ``blendserve``."""

    model_config = ConfigDict(extra="allow")

    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[ChatChoice]
    usage: UsageInfo
    blendserve: VoteOut | None = None


class CompletionChoice(BaseModel):
    """One choice of a text completion: the final answer in ``text``; :func:`thought_fields`."""

    model_config = ConfigDict(extra="allow", json_schema_extra=_documents_thought)

    index: int
    text: str
    finish_reason: str | None
    logprobs: None = None


class Completion(BaseModel):
    """OpenAI's ``text_completion``; ``blendserve`` has one vote per prompt."""

    model_config = ConfigDict(extra="allow")

    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: UsageInfo
    blendserve: list[VoteOut] | None = None
