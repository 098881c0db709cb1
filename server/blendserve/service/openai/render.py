"""OpenAI response objects and stream chunks, from voted answers or plain samples."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from blendserve.core.answers import DEFAULT_REASONING_TAGS, ReasoningTags
from blendserve.engines.base import Sample
from blendserve.scheduler import AnswerEvent
from blendserve.service.openai.schemas import (
    ChatChoice,
    ChatCompletion,
    ChatMessageOut,
    Completion,
    CompletionChoice,
    UsageInfo,
    VoteOut,
    thought_fields,
)
from blendserve.service.vocabulary import vote_fields

__all__ = ["Choice", "Reply", "choices_from_answers", "choices_from_samples"]

DONE = "data: [DONE]\n\n"


@dataclass(frozen=True)
class Choice:
    """One choice: its index, text (a reasoning model's final answer), finish reason and thought."""

    index: int
    text: str
    finish_reason: str | None
    reasoning: str | None = None


def choices_from_answers(events: Sequence[AnswerEvent], n: int) -> list[Choice]:
    """The ``n`` most-voted distinct answers of each question, each as a real completion.

    Question ``i``'s choices have indices ``i*n ... i*n+n-1`` (fewer when it had
    fewer distinct answers; one, its last completion, when it had none). Each
    keeps its sample's thought and finish reason (``length``: every sample of the
    question was cut at ``max_tokens``, or it stopped ``truncated``).
    """
    choices = []
    for i, event in enumerate(events):
        picked = [
            (completion, event.finish_reasons.get(key), event.thoughts.get(key))
            for key, (_, completion) in event.candidates.items()
        ][:n]
        if not picked:
            picked = [
                (event.abstained or "", event.abstained_finish_reason, event.abstained_thought)
            ]
        choices += [
            Choice(i * n + j, text, finish or "stop", thought)
            for j, (text, finish, thought) in enumerate(picked)
        ]
    return choices


def choices_from_samples(
    samples: Sequence[Sample], start: int = 0, tags: ReasoningTags = DEFAULT_REASONING_TAGS
) -> list[Choice]:
    """Plain samples as choices (self-consistency off, on an engine with no raw upstream).

    Each is read for a thought with ``tags``, as a voted sample is: one whose
    thought never closed finishes ``length``.
    """
    choices = []
    for j, sample in enumerate(samples):
        thought = sample.thought(tags)
        finish = "length" if thought.cut else sample.finish_reason
        choices.append(Choice(start + j, thought.content, finish, thought.reasoning))
    return choices


def vote_out(event: AnswerEvent, temperature: float | None) -> VoteOut:
    """The ``blendserve`` field of one question whose samples were drawn at ``temperature``."""
    return VoteOut(temperature=temperature, **vote_fields(event))


class Reply:
    """One response in the making: the parts a full object and its stream share.

    Args:
        chat: chat completion (else text completion).
        model: the ``model`` field.
    """

    def __init__(self, chat: bool, model: str) -> None:
        self.chat = chat
        self.model = model
        self.id = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}"
        self.created = int(time.time())

    def full(
        self, choices: Sequence[Choice], usage: UsageInfo, votes: Sequence[VoteOut] | None
    ) -> ChatCompletion | Completion:
        """The whole response object."""
        if self.chat:
            return ChatCompletion(
                id=self.id,
                created=self.created,
                model=self.model,
                choices=[
                    ChatChoice(
                        index=c.index,
                        message=ChatMessageOut(content=c.text, **thought_fields(c.reasoning)),
                        finish_reason=c.finish_reason,
                    )
                    for c in choices
                ],
                usage=usage,
                blendserve=votes[0] if votes else None,
            )
        return Completion(
            id=self.id,
            created=self.created,
            model=self.model,
            choices=[
                CompletionChoice(
                    index=c.index,
                    text=c.text,
                    finish_reason=c.finish_reason,
                    **thought_fields(c.reasoning),
                )
                for c in choices
            ],
            usage=usage,
            blendserve=list(votes) if votes is not None else None,
        )

    def _chunk(self, choices: list[dict[str, Any]], **extra: Any) -> str:
        body = {
            "id": self.id,
            "object": "chat.completion.chunk" if self.chat else "text_completion",
            "created": self.created,
            "model": self.model,
            "choices": choices,
            **extra,
        }
        return f"data: {json.dumps(body)}\n\n"

    def opening(self) -> str:
        """The first chunk, sent before any answer is known (chat: the role)."""
        if self.chat:
            delta = {"role": "assistant", "content": ""}
            return self._chunk([{"index": 0, "delta": delta, "finish_reason": None}])
        return self._chunk([{"index": 0, "text": "", "finish_reason": None, "logprobs": None}])

    def chunks(
        self,
        choices: Sequence[Choice],
        usage: UsageInfo | None,
        votes: Sequence[VoteOut] | None,
    ) -> Iterator[str]:
        """Every choice's thought, content and finish, the usage chunk if asked, then ``[DONE]``.

        A thought goes first, in a chunk of its own: ``delta.reasoning`` and
        ``delta.reasoning_content`` (a text completion's choice: ``reasoning``
        and ``reasoning_content``), as vLLM streams a reasoning parser's.
        """
        extra: dict[str, Any] = {}
        if votes is not None:
            dumped = [v.model_dump() for v in votes]
            extra["blendserve"] = dumped[0] if self.chat else dumped
        for c in choices:
            thought = thought_fields(c.reasoning)
            if self.chat:
                deltas: list[dict[str, Any]] = [thought] if thought else []
                deltas.append({"content": c.text})
                if c.index != 0:
                    deltas[0] = {"role": "assistant", **deltas[0]}
                for delta in deltas:
                    yield self._chunk([{"index": c.index, "delta": delta, "finish_reason": None}])
                last = {"index": c.index, "delta": {}, "finish_reason": c.finish_reason}
            else:
                piece = {"index": c.index, "text": "", "finish_reason": None, "logprobs": None}
                if thought:
                    yield self._chunk([{**piece, **thought}])
                yield self._chunk([{**piece, "text": c.text}])
                last = {
                    "index": c.index,
                    "text": "",
                    "finish_reason": c.finish_reason,
                    "logprobs": None,
                }
            yield self._chunk([last], **(extra if c is choices[-1] else {}))
        if usage is not None:
            yield self._chunk([], usage=usage.model_dump())
        yield DONE


def usage_of(
    prompt_tokens: int, completion_tokens: int, reasoning_tokens: int | None = None
) -> UsageInfo:
    """OpenAI's usage object; ``reasoning_tokens`` (None: not counted) in its details."""
    counted = {"completion_tokens_details": {"reasoning_tokens": reasoning_tokens}}
    return UsageInfo(
        prompt_tokens=prompt_tokens,
        completion_tokens=completion_tokens,
        total_tokens=prompt_tokens + completion_tokens,
        **(counted if reasoning_tokens is not None else {}),
    )


def reasoning_tokens_of(counts: Iterable[int | None]) -> int | None:
    """The sum of the counted ``counts``; None when none was counted."""
    known = [count for count in counts if count is not None]
    return sum(known) if known else None
