"""Question sets for the simulator: recorded answers or synthetic distributions."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
from numpy.typing import NDArray

from blendserve.recordings.format import RecordedQuestion, RecordedSample, merge, parse_record
from blendserve.util.jsonl import read_jsonl

__all__ = ["MIN_ANSWERS", "DataError", "Dataset", "load_jsonl"]

#: Questions with fewer non-null recorded answers are dropped.
MIN_ANSWERS = 8


class DataError(ValueError):
    """Input data that cannot be simulated; the message says where and why."""


@dataclass(frozen=True)
class Dataset:
    """Each question's "true" answer distribution (``probs``), most likely answer first.

    Answer 0 of every question is its true mode; questions whose mode is tied are
    left out (counted in ``num_dropped``, with those of too few answers). A recorded
    set keeps, per question and answer (in the order of ``probs``), the ``recorded``
    samples that gave it: their lengths and confidences (None: synthetic or built
    from distributions).
    """

    name: str
    ids: list[str]
    probs: list[NDArray[np.float64]]
    num_dropped: int = 0
    recorded: list[tuple[tuple[RecordedSample, ...], ...]] | None = None

    @property
    def num_questions(self) -> int:
        """Questions kept."""
        return len(self.probs)

    def margins(self) -> NDArray[np.float64]:
        """Per question ``(sqrt(p1) - sqrt(p2))^2`` (paper, Theorem 1)."""
        p1 = np.array([p[0] for p in self.probs])
        p2 = np.array([p[1] if len(p) > 1 else 0.0 for p in self.probs])
        return np.asarray((np.sqrt(p1) - np.sqrt(p2)) ** 2)

    def mean_tokens(self) -> NDArray[np.float64] | None:
        """Per question, the completion tokens a simulated sample of it is charged: the mean
        recorded tokens of its samples that gave an answer (those the simulator draws
        from; a sample with no answer is never drawn, its tokens no more counted than the
        sample). That is the expected length of the answer drawn, so a run's tokens are
        ``sum over q of samples(q) * mean_tokens[q]``. None: some question has no
        recorded length (older data has none)."""
        if self.recorded is None:
            return None
        means = []
        for answers in self.recorded:
            lengths = [s.tokens for samples in answers for s in samples if s.tokens is not None]
            if not lengths:
                return None
            means.append(sum(lengths) / len(lengths))
        return np.asarray(means, dtype=np.float64)

    @classmethod
    def from_probs(cls, name: str, probs: list[NDArray[np.float64]]) -> Dataset:
        """Builds a dataset from distributions, dropping those with a tied mode."""
        kept: list[NDArray[np.float64]] = []
        for p in probs:
            p = np.sort(np.asarray(p, dtype=np.float64))[::-1]
            if len(p) > 1 and p[0] <= p[1]:
                continue
            kept.append(p / p.sum())
        if not kept:
            raise DataError(f"{name}: no question has a unique most likely answer")
        ids = [str(i) for i in range(len(kept))]
        return cls(name, ids, kept, len(probs) - len(kept))


def load_jsonl(path: str | Path) -> Dataset:
    """Reads a recording (:mod:`blendserve.recordings.format`): one JSON object per line,
    ``{"id", "samples": [...]}`` or the older ``{"id", "answers": [...]}``; lines of one
    id are one question (a line without one is named by its number).

    A question's distribution is the frequency of its non-null answers, most frequent
    first (ties in the order first seen); questions with fewer than
    :data:`MIN_ANSWERS` of them or a tied mode are dropped.

    Raises:
        DataError: unreadable file, malformed line (named ``file:line``), or no usable
            question.
    """
    path = Path(path)
    questions: list[RecordedQuestion] = []
    try:
        for lineno, record in read_jsonl(path, "recorded answers"):
            if isinstance(record, dict) and "id" not in record:
                record = {**record, "id": lineno}
            questions.append(parse_record(record, f"{path}:{lineno}"))
    except ValueError as exc:
        raise DataError(str(exc)) from None
    ids: list[str] = []
    probs: list[NDArray[np.float64]] = []
    recorded: list[tuple[tuple[RecordedSample, ...], ...]] = []
    merged = merge(questions)
    for question in merged:
        by_answer: dict[str, list[RecordedSample]] = {}
        for sample in question.samples:
            if sample.answer is not None:
                by_answer.setdefault(sample.answer, []).append(sample)
        # A stable sort: answers of equal counts stay in the order first seen.
        answers = sorted(by_answer.values(), key=len, reverse=True)
        counts = [len(samples) for samples in answers]
        if sum(counts) < MIN_ANSWERS or (len(counts) > 1 and counts[0] == counts[1]):
            continue
        ids.append(question.id)
        probs.append(np.asarray(counts, dtype=np.float64) / sum(counts))
        recorded.append(tuple(tuple(samples) for samples in answers))
    if not merged:
        raise DataError(f"{path}: no questions (empty file)")
    if not probs:
        raise DataError(
            f"{path}: all {len(merged)} questions dropped "
            f"(fewer than {MIN_ANSWERS} answers or a tied most frequent answer)"
        )
    return Dataset(path.stem, ids, probs, len(merged) - len(probs), recorded)
