"""Synthetic recordings whose samples carry length and confidence, informative to a
chosen degree, in the recording format (:mod:`blendserve.recordings.format`).

A question's answers are drawn from a family of :mod:`blendserve.sim.synthetic`
(``flat``: a Dirichlet over 3-8 answers; ``peaked``: a peaked pair over a rare tail); its
answer key (``gold``) is answer ``"0"``, the true mode. Each sample's confidence
trajectory (one value per block of 16 tokens, windows of 64) scatters around a
per-question level: a right sample's level is ``d`` standard deviations higher on
average, and a wrong one dips somewhere along the trace (DeepConf's observation: a
wrong chain has a stretch where the model is unsure) by ``d`` times the dip scale. With
``d = 0`` the confidence is noise. A wrong sample is ``length_ratio`` times longer than a
right one on average (1: length says nothing). A few wrong samples give no answer: they
ran to ``max_tokens``. Pure and seeded.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

import numpy as np

from blendserve.core.signals import Confidence
from blendserve.recordings.format import RecordedQuestion, RecordedSample
from blendserve.sim.synthetic import synthetic

__all__ = ["TRACE_FAMILIES", "trace_recording", "write_recording"]

#: Family of these recordings -> the :func:`~blendserve.sim.synthetic.synthetic` family
#: its answers are drawn from.
TRACE_FAMILIES = {"flat": "flat", "peaked": "tail"}
#: Tokens a trajectory point sums up, and the window (in tokens) of its groups.
BLOCK = 16
WINDOW = 64
#: Completion tokens a sample has at least and at most (``max_tokens``).
MIN_TOKENS = 150
MAX_TOKENS = 600
#: Spread of question levels, of a sample's level around its question's, and of a
#: block's value around its sample's; the depth scale of a wrong sample's dip.
_QUESTION_SD = 1.0
_SAMPLE_SD = 0.5
_BLOCK_SD = 0.8
_DIP = 1.5
#: Spread of a sample's length around its question's (log scale).
_LENGTH_SD = 0.15


def _confidence(groups: list[float], tokens: int) -> Confidence:
    """The summary of a trajectory of ``tokens`` tokens, as a meter would read it at
    block granularity: mean, lowest window, last window."""
    rounded = tuple(round(g, 4) for g in groups)
    sizes = [BLOCK] * len(rounded)
    sizes[-1] = tokens - BLOCK * (len(rounded) - 1)
    mean = sum(g * s for g, s in zip(rounded, sizes, strict=True)) / tokens
    partial = Confidence(mean, mean, mean, tokens, WINDOW, BLOCK, rounded)
    windows = [value for _, value in partial.windows(WINDOW // BLOCK)]
    lowest = min(windows) if windows else mean
    tail = windows[-1] if windows else mean
    return Confidence(
        round(mean, 4), round(lowest, 4), round(tail, 4), tokens, WINDOW, BLOCK, rounded
    )


def trace_recording(
    family: str,
    num_questions: int = 100,
    samples: int = 32,
    d: float = 1.0,
    length_ratio: float = 1.0,
    seed: int = 0,
    no_answer: float = 0.05,
) -> list[RecordedQuestion]:
    """A recording of ``num_questions`` questions of ``family`` (:data:`TRACE_FAMILIES`),
    ``samples`` samples each, confidence informative to degree ``d`` and wrong samples
    ``length_ratio`` times as long as right ones; a share ``no_answer`` of the wrong ones
    give no answer and run to :data:`MAX_TOKENS`.

    Raises:
        ValueError: an unknown family or a bad size, degree or ratio.
    """
    if family not in TRACE_FAMILIES:
        raise ValueError(f"unknown family {family!r} (known: {', '.join(TRACE_FAMILIES)})")
    if samples < 1 or d < 0 or length_ratio <= 0 or not 0 <= no_answer < 1:
        raise ValueError("samples must be positive, d at least 0, length_ratio above 0")
    answers = synthetic(TRACE_FAMILIES[family], num_questions, seed=seed)
    rng = np.random.default_rng((seed, 7919))
    questions = []
    for q, probs in enumerate(answers.probs):
        level = 12.0 + _QUESTION_SD * rng.standard_normal()
        base = rng.uniform(200.0, 400.0)
        drawn = rng.choice(len(probs), size=samples, p=probs / probs.sum())
        recorded = []
        for answer in drawn.tolist():
            right = answer == 0
            gives_none = not right and rng.random() < no_answer
            if gives_none:
                tokens = MAX_TOKENS
            else:
                stretch = 1.0 if right else length_ratio
                length = base * stretch * float(np.exp(_LENGTH_SD * rng.standard_normal()))
                tokens = int(np.clip(round(length), MIN_TOKENS, MAX_TOKENS))
            num_blocks = -(-tokens // BLOCK)
            own = level + _SAMPLE_SD * (rng.standard_normal() + (d if right else 0.0))
            groups = own + _BLOCK_SD * rng.standard_normal(num_blocks)
            if not right and d > 0:
                start = int(rng.integers(0, max(1, num_blocks - WINDOW // BLOCK + 1)))
                depth = d * _DIP * (0.5 + rng.random())
                groups[start : start + WINDOW // BLOCK] -= depth
            confidence = _confidence(np.maximum(groups, 0.1).tolist(), tokens)
            recorded.append(
                RecordedSample(
                    answer=None if gives_none else str(answer),
                    tokens=tokens,
                    finish="length" if gives_none else "stop",
                    confidence=confidence,
                )
            )
        questions.append(
            RecordedQuestion(
                id=f"{family}-{q}",
                samples=tuple(recorded),
                gold="0",
                extra={"answer_format": "auto"},
            )
        )
    return questions


def write_recording(path: Path, questions: Iterable[RecordedQuestion]) -> None:
    """Writes ``questions`` as a recording, one JSON line each."""
    with path.open("w", encoding="utf-8") as out:
        for question in questions:
            out.write(question.dumps() + "\n")


def _main() -> None:  # pragma: no cover - a convenience for writing a set out
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("family", choices=sorted(TRACE_FAMILIES))
    parser.add_argument("out", type=Path)
    parser.add_argument("--questions", type=int, default=100)
    parser.add_argument("--samples", type=int, default=32)
    parser.add_argument("--d", type=float, default=1.0)
    parser.add_argument("--length-ratio", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    questions = trace_recording(
        args.family, args.questions, args.samples, args.d, args.length_ratio, args.seed
    )
    write_recording(args.out, questions)
    print(json.dumps({"questions": len(questions), "out": str(args.out)}))


if __name__ == "__main__":  # pragma: no cover
    _main()
