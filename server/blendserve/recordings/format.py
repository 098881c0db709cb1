"""The recording format: every sample of a question as it came, one JSON line a question.

``{"id", "prompt"?, "messages"?, "gold"?, "samples": [{"answer", "tokens", "finish",
"stop"?, "stopped"?, "confidence"?: {"mean", "lowest_group", "tail", ...}, "groups"?: [...],
"text"?}]}``, a superset of the older ``{"id", "answers": [...]}``, which still reads
(its samples have no length or confidence). Lines that share an ``id`` are one question,
their samples in order: a recorder that resumes appends what it adds. Pure: no I/O.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from blendserve.core.signals import Confidence

__all__ = ["MAX_RECORDED_TOKENS", "RecordedQuestion", "RecordedSample", "merge", "parse_record"]

#: The most tokens a recorded sample may say it had: far past any context.
MAX_RECORDED_TOKENS = 2**31


@dataclass(frozen=True)
class RecordedSample:
    """One sample: its extracted ``answer`` (None: it gave none), completion ``tokens``
    (None: not recorded), ``finish`` and ``stop`` reasons, ``confidence``, and why it
    stopped (``stopped``, :data:`~blendserve.core.traces.STOPS`: written only where it is
    not ``finished``, the default)."""

    answer: str | None
    tokens: int | None = None
    finish: str | None = None
    stop: str | None = None
    confidence: Confidence | None = None
    text: str | None = None
    stopped: str = "finished"

    def to_json(self) -> dict[str, Any]:
        """The sample as a recording line holds it."""
        line: dict[str, Any] = {"answer": self.answer, "tokens": self.tokens, "finish": self.finish}
        if self.stop is not None:
            line["stop"] = self.stop
        if self.confidence is not None:
            line["confidence"] = self.confidence.to_json()
            if self.confidence.groups:
                line["groups"] = self.confidence.groups_json()
        if self.text is not None:
            line["text"] = self.text
        if self.stopped != "finished":
            line["stopped"] = self.stopped
        return line


@dataclass(frozen=True)
class RecordedQuestion:
    """A question and its samples in the order they came; ``prompt`` or ``messages``
    where recorded, and its answer key ``gold`` where known."""

    id: str
    samples: tuple[RecordedSample, ...]
    prompt: str | None = None
    messages: Sequence[Mapping[str, Any]] | None = None
    gold: str | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)

    @property
    def answers(self) -> list[str | None]:
        """Each sample's answer, in order."""
        return [s.answer for s in self.samples]

    def to_json(self) -> dict[str, Any]:
        """The question as one recording line."""
        line: dict[str, Any] = {"id": self.id, **self.extra}
        if self.prompt is not None:
            line["prompt"] = self.prompt
        if self.messages is not None:
            line["messages"] = [dict(m) for m in self.messages]
        if self.gold is not None:
            line["gold"] = self.gold
        line["samples"] = [s.to_json() for s in self.samples]
        return line

    def dumps(self) -> str:
        """The question as one line of JSON, without its line end."""
        return json.dumps(self.to_json(), ensure_ascii=False, separators=(",", ":"))


def parse_record(record: Any, where: str) -> RecordedQuestion:
    """A recording line (either shape) read into a question; ``where`` names the line in
    errors. An older line's answers are its samples; a JSON object or list answer is kept
    as its JSON text, so that equal ones vote together.

    Raises:
        ValueError: not an object with a ``samples`` or ``answers`` list, or a sample
            of the wrong shape.
    """
    if not isinstance(record, dict):
        raise ValueError(f"{where}: not a JSON object")
    samples = record.get("samples")
    if samples is None and isinstance(record.get("answers"), list):
        samples = [{"answer": a} for a in record["answers"]]
    if not isinstance(samples, list):
        raise ValueError(f"{where}: expected an object with a 'samples' or an 'answers' list")
    parsed = tuple(_sample(s, f"{where}: samples[{i}]") for i, s in enumerate(samples))
    messages = record.get("messages")
    known = {"id", "prompt", "messages", "gold", "samples", "answers"}
    return RecordedQuestion(
        id=str(record.get("id", where)),
        samples=parsed,
        prompt=_text(record.get("prompt")),
        messages=messages if isinstance(messages, list) else None,
        gold=_text(record.get("gold")),
        extra={k: v for k, v in record.items() if k not in known},
    )


def merge(questions: Iterable[RecordedQuestion]) -> list[RecordedQuestion]:
    """Questions that share an id made one, their samples in order; first seen first."""
    merged: dict[str, RecordedQuestion] = {}
    for question in questions:
        seen = merged.get(question.id)
        if seen is None:
            merged[question.id] = question
        else:
            merged[question.id] = RecordedQuestion(
                seen.id,
                seen.samples + question.samples,
                seen.prompt if seen.prompt is not None else question.prompt,
                seen.messages if seen.messages is not None else question.messages,
                seen.gold if seen.gold is not None else question.gold,
                {**question.extra, **seen.extra},
            )
    return list(merged.values())


def _text(value: Any) -> str | None:
    if value is None:
        return None
    return value if isinstance(value, str) else json.dumps(value)


def _sample(value: Any, where: str) -> RecordedSample:
    if not isinstance(value, dict):
        raise ValueError(f"{where}: not an object")
    answer = value.get("answer")
    if isinstance(answer, (dict, list)):
        answer = json.dumps(answer)
    elif answer is not None and not isinstance(answer, str):
        answer = str(answer)
    tokens = value.get("tokens")
    countable = isinstance(tokens, int) and not isinstance(tokens, bool)
    if tokens is not None and not (countable and 0 <= tokens <= MAX_RECORDED_TOKENS):
        raise ValueError(f"{where}.tokens: must be a count of tokens, got {tokens!r}")
    confidence = None
    if value.get("confidence") is not None:
        summary = value["confidence"]
        if not isinstance(summary, dict):
            raise ValueError(f"{where}.confidence: not an object")
        groups = value.get("groups") or ()
        if not isinstance(groups, list | tuple):
            raise ValueError(f"{where}.groups: not a list")
        try:
            confidence = Confidence.from_json(summary, groups)
        except ValueError as exc:
            raise ValueError(f"{where}: {exc}") from None
    return RecordedSample(
        answer=answer,
        tokens=tokens,
        finish=_text(value.get("finish")),
        stop=_text(value.get("stop")),
        confidence=confidence,
        text=value.get("text") if isinstance(value.get("text"), str) else None,
        stopped=_text(value.get("stopped")) or "finished",
    )
