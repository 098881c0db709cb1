"""Question sets for the simulator: recorded answers or synthetic distributions."""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from numpy.typing import NDArray

__all__ = ["MIN_ANSWERS", "DataError", "Dataset", "load_jsonl"]

#: Questions with fewer non-null recorded answers are dropped.
MIN_ANSWERS = 8


class DataError(ValueError):
    """Input data that cannot be simulated; the message says where and why."""


@dataclass(frozen=True)
class Dataset:
    """Each question's "true" answer distribution (``probs``), most likely answer first.

    Answer 0 of every question is its true mode; questions whose mode is tied are
    left out (counted in ``num_dropped``, with those of too few answers).
    """

    name: str
    ids: list[str]
    probs: list[NDArray[np.float64]]
    num_dropped: int = 0

    @property
    def num_questions(self) -> int:
        """Questions kept."""
        return len(self.probs)

    def margins(self) -> NDArray[np.float64]:
        """Per question ``(sqrt(p1) - sqrt(p2))^2`` (paper, Theorem 1)."""
        p1 = np.array([p[0] for p in self.probs])
        p2 = np.array([p[1] if len(p) > 1 else 0.0 for p in self.probs])
        return np.asarray((np.sqrt(p1) - np.sqrt(p2)) ** 2)

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
    """Reads recorded answers: one JSON object per line with ``id`` and ``answers``.

    A question's distribution is the frequency of its non-null answers; questions
    with fewer than :data:`MIN_ANSWERS` of them or a tied mode are dropped.

    Raises:
        DataError: unreadable file, malformed line (with its number), or no usable question.
    """
    path = Path(path)
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise DataError(f"cannot read {path}: {exc}") from exc
    ids: list[str] = []
    probs: list[NDArray[np.float64]] = []
    num_read = 0
    for lineno, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            raise DataError(f"{path}:{lineno}: not valid JSON ({exc.msg})") from exc
        answers = record.get("answers") if isinstance(record, dict) else None
        if not isinstance(answers, list):
            raise DataError(f"{path}:{lineno}: expected an object with an 'answers' list")
        num_read += 1
        votes = Counter(json.dumps(a) if isinstance(a, (dict, list)) else a for a in answers)
        votes.pop(None, None)
        counts = sorted(votes.values(), reverse=True)
        if sum(counts) < MIN_ANSWERS or (len(counts) > 1 and counts[0] == counts[1]):
            continue
        ids.append(str(record.get("id", lineno)))
        probs.append(np.asarray(counts, dtype=np.float64) / sum(counts))
    if num_read == 0:
        raise DataError(f"{path}: no questions (empty file)")
    if not probs:
        raise DataError(
            f"{path}: all {num_read} questions dropped "
            f"(fewer than {MIN_ANSWERS} answers or a tied most frequent answer)"
        )
    return Dataset(path.stem, ids, probs, num_read - len(probs))
