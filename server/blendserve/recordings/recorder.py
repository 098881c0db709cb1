"""Records a questions file against an engine: every sample, its answer, length and
confidence, appended as each question's samples come back; a run resumes where the file
stops.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, TextIO

from blendserve.answers import AnswerKind, acanonical_key, aextract
from blendserve.core.answers import check_kind
from blendserve.core.signals import ConfidenceSpec
from blendserve.engines.base import Engine, GenerateRequest, Sample, SamplingParams
from blendserve.recordings.format import RecordedQuestion, RecordedSample, merge, parse_record
from blendserve.util.jsonl import read_jsonl

__all__ = ["Question", "RecordPlan", "read_questions", "record", "recorded"]


@dataclass(frozen=True)
class Question:
    """A question to record: ``prompt`` (completions) or ``messages`` (chat), its answer
    key ``gold`` and ``answer_format`` where the questions file gives them."""

    id: str
    prompt: str | None = None
    messages: Sequence[Mapping[str, Any]] | None = None
    gold: str | None = None
    answer_format: str | None = None


@dataclass(frozen=True)
class RecordPlan:
    """What to record: ``samples`` a question, asked ``per_request`` at a time (a question's
    samples at once, by default), questions ``concurrency`` at a time, with ``params``;
    answers read as ``answer_format`` (a question's own first) and keyed as votes are;
    ``confidence`` read from logprobs (None: none asked for); ``chat``: a prompt is sent
    as one user message; ``keep_text``: the completion text is recorded too."""

    samples: int = 16
    answer_format: AnswerKind = "auto"
    pattern: str | None = None
    params: SamplingParams = field(default_factory=SamplingParams)
    confidence: ConfidenceSpec | None = None
    chat: bool = True
    concurrency: int = 4
    per_request: int | None = None
    keep_text: bool = False
    timeout: float | None = None


def read_questions(path: Path) -> list[Question]:
    """Questions from JSON lines: ``{"id"?, "prompt" | "messages" | "question", "gold"?,
    "answer_format"?}`` or a JSON string (the prompt). A line without an id is named by
    its number.

    Raises:
        ValueError: the file or a line is unusable (named), or ids repeat.
    """
    questions: list[Question] = []
    seen: set[str] = set()
    for lineno, value in read_jsonl(path, "questions"):
        where = f"{path}:{lineno}"
        if isinstance(value, str):
            value = {"prompt": value}
        if not isinstance(value, dict):
            raise ValueError(f"{where}: expected an object or a string")
        prompt = value.get("prompt", value.get("question"))
        messages = value.get("messages")
        if (prompt is None) == (messages is None):
            raise ValueError(f"{where}: give exactly one of prompt (or question) and messages")
        if prompt is not None and not isinstance(prompt, str):
            raise ValueError(f"{where}: prompt must be a string")
        if messages is not None and not (
            isinstance(messages, list) and messages and all(isinstance(m, dict) for m in messages)
        ):
            raise ValueError(f"{where}: messages must be a list of objects")
        kind = value.get("answer_format")
        if kind is not None:
            try:
                check_kind(kind)
            except ValueError as exc:
                raise ValueError(f"{where}: {exc}") from None
        qid = str(value.get("id", lineno))
        if qid in seen:
            raise ValueError(f"{where}: id {qid!r} repeats an earlier line's")
        seen.add(qid)
        gold = value.get("gold")
        questions.append(Question(qid, prompt, messages, None if gold is None else str(gold), kind))
    if not questions:
        raise ValueError(f"{path}: no questions")
    return questions


def recorded(path: Path) -> dict[str, RecordedQuestion]:
    """What a recording file holds, by question id (nothing: no file yet). A last line cut
    short by an interrupted run is left out, and overwritten by the next.

    Raises:
        ValueError: a line other than the last is unusable.
    """
    if not path.exists():
        return {}
    lines = path.read_bytes().split(b"\n")
    records = []
    for lineno, raw in enumerate(lines, start=1):
        if not raw.strip():
            continue
        try:
            value = json.loads(raw)
        except ValueError:
            if lineno == len(lines):  # the line an interrupted write left
                break
            raise ValueError(f"{path}:{lineno}: not valid JSON") from None
        records.append(parse_record(value, f"{path}:{lineno}"))
    return {q.id: q for q in merge(records)}


def _seed(question_id: str, base: int) -> int:
    """A question's seed: its id's hash moved by ``base``, so that runs are repeatable."""
    digest = hashlib.sha256(question_id.encode()).digest()
    return (int.from_bytes(digest[:4], "big") + base) % 2**31


async def record(
    engine: Engine,
    questions: Sequence[Question],
    out: Path,
    plan: RecordPlan,
    progress: Callable[[str], None] | None = None,
) -> int:
    """Records each question's missing samples into ``out``, appending one line a request;
    returns the samples added. What ``out`` holds already is kept: a run interrupted
    anywhere resumes, asking only for what it lacks (the seeds carry on from there).

    Raises:
        ValueError: ``out`` holds an unusable line.
        EngineError: the engine failed a request past its retries.
    """
    have = recorded(out)
    todo = [
        (q, len(have[q.id].samples) if q.id in have else 0)
        for q in questions
        if q.id not in have or len(have[q.id].samples) < plan.samples
    ]
    _trim_partial_line(out)
    started = time.monotonic()
    added = 0
    tokens = 0
    done = len(questions) - len(todo)
    gate = asyncio.Semaphore(max(1, plan.concurrency))

    async def one(question: Question, start: int, file: TextIO) -> None:
        nonlocal added, tokens, done
        async with gate:
            while start < plan.samples:
                n = plan.samples - start
                if plan.per_request is not None:
                    n = min(n, plan.per_request)
                samples = await engine.generate(_request(question, start, n, plan))
                line = await _line(question, samples, plan, first=start == 0)
                file.write(line.dumps() + "\n")
                file.flush()
                start += len(samples)
                added += len(samples)
                tokens += sum(s.completion_tokens for s in samples)
        done += 1
        if progress is not None:
            rate = tokens / max(time.monotonic() - started, 1e-9)
            progress(
                f"{done}/{len(questions)} questions, {added} samples added, {rate:.1f} tokens/s"
            )

    with out.open("a", encoding="utf-8") as file:
        tasks = [asyncio.ensure_future(one(q, start, file)) for q, start in todo]
        try:
            await asyncio.gather(*tasks)
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
    return added


def _trim_partial_line(out: Path) -> None:
    """Cuts a last line an interrupted write left unfinished, so appends start clean."""
    if not out.exists():
        return
    data = out.read_bytes()
    if data and not data.endswith(b"\n"):
        out.write_bytes(data[: data.rfind(b"\n") + 1])


def _request(question: Question, start: int, n: int, plan: RecordPlan) -> GenerateRequest:
    params = plan.params
    if params.seed is not None:
        params = replace(params, seed=_seed(question.id, params.seed))
    messages = question.messages
    if messages is None and plan.chat:
        messages = [{"role": "user", "content": question.prompt}]
    return GenerateRequest(
        prompt=None if messages is not None else question.prompt,
        messages=messages,
        n=n,
        params=params.from_sample(start),
        question_id=question.id,
        timeout=plan.timeout,
        confidence=plan.confidence,
    )


async def _line(
    question: Question, samples: Sequence[Sample], plan: RecordPlan, first: bool
) -> RecordedQuestion:
    """The line a request's samples make: each answer keyed as a vote keys it, and none
    for a sample cut at ``max_tokens`` (or whose thought never closed), which never votes."""
    kind: Any = question.answer_format or plan.answer_format
    recorded_samples = []
    for sample in samples:
        thought = sample.thought()
        cut = thought.cut or sample.finish_reason == "length"
        answer = None if cut else await aextract(thought.content, kind, plan.pattern)
        if answer is not None:
            answer = await acanonical_key(answer, kind)
        recorded_samples.append(
            RecordedSample(
                answer=answer,
                tokens=sample.completion_tokens,
                finish=sample.finish_reason,
                stop=sample.stop_reason,
                confidence=sample.confidence,
                text=sample.text if plan.keep_text else None,
            )
        )
    extra = {"answer_format": question.answer_format} if first and question.answer_format else {}
    return RecordedQuestion(
        id=question.id,
        samples=tuple(recorded_samples),
        prompt=question.prompt if first else None,
        messages=question.messages if first else None,
        gold=question.gold if first else None,
        extra=extra,
    )


def print_progress(line: str) -> None:
    """Progress on stderr, one line each."""
    print(line, file=sys.stderr, flush=True)
