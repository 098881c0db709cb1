"""What a recording with answer keys shows, before any policy uses it: accuracy, SC@k's
error, and how a sample's correctness relates to its length and to each confidence
measure, across the recording's samples and within a question.

    python bench/recordings/report.py bench/recordings/qwen2.5-coder-0.5b.jsonl [--json F]

Within a question: for each question whose samples are some right and some wrong, the
chance that a right sample scores higher than a wrong one of the same question (an
AUROC; 0.5: the measure says nothing there, 1: it always ranks the right ones first),
averaged over those questions. Across: the same over all samples pooled, which also
tells easy questions from hard ones. Length is ranked shorter first.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from blendserve.answers import canonical_key
from blendserve.recordings.format import RecordedQuestion, RecordedSample, merge, parse_record
from blendserve.util.jsonl import read_jsonl

Measure = Callable[[RecordedSample], float | None]

#: Each measure, higher meaning "more likely right" as DeepConf and short-m@k read it.
MEASURES: dict[str, Measure] = {
    "shorter": lambda s: None if s.tokens is None else -s.tokens,
    "mean confidence": lambda s: None if s.confidence is None else s.confidence.mean,
    "lowest group": lambda s: None if s.confidence is None else s.confidence.lowest_group,
    "tail": lambda s: None if s.confidence is None else s.confidence.tail,
}


def load(path: Path) -> list[RecordedQuestion]:
    """The recording's questions that have an answer key."""
    records = [parse_record(value, f"{path}:{n}") for n, value in read_jsonl(path, "recording")]
    return [q for q in merge(records) if q.gold is not None]


def gold_key(question: RecordedQuestion) -> str:
    """The question's answer key, keyed as its samples' answers were."""
    assert question.gold is not None
    kind = question.extra.get("answer_format", "auto")
    return canonical_key(question.gold, kind)


def auroc(right: Sequence[float], wrong: Sequence[float]) -> float | None:
    """P(a right one scores above a wrong one), ties counting half (None: a side empty)."""
    if not right or not wrong:
        return None
    above = sum((r > w) + 0.5 * (r == w) for r in right for w in wrong)
    return above / (len(right) * len(wrong))


def vote_error(answers: Sequence[str | None], gold: str, rng: random.Random) -> float:
    """The chance a majority vote of ``answers`` is wrong (a tie broken at random)."""
    counts = Counter(a for a in answers if a is not None)
    if not counts:
        return 1.0
    top = max(counts.values())
    leaders = [a for a, c in counts.items() if c == top]
    return 0.0 if gold in leaders and len(leaders) == 1 else 1 - (gold in leaders) / len(leaders)


def report(questions: list[RecordedQuestion], seed: int = 0) -> dict[str, Any]:
    """The figures of :mod:`the module <__doc__>`, as one JSON-ready dict."""
    rng = random.Random(seed)
    samples = right = 0
    errors: list[float] = []
    tokens: dict[str, list[int]] = {"right": [], "wrong": []}
    pooled: dict[str, dict[str, list[float]]] = {m: {"right": [], "wrong": []} for m in MEASURES}
    within: dict[str, list[float]] = {m: [] for m in MEASURES}
    mixed = finished = 0
    for question in questions:
        gold = gold_key(question)
        errors.append(vote_error(question.answers, gold, rng))
        marks = [s.answer == gold for s in question.samples]
        samples += len(marks)
        right += sum(marks)
        mixed += any(marks) and not all(marks)
        for sample, mark in zip(question.samples, marks, strict=True):
            finished += sample.finish == "stop"
            if sample.tokens is not None:
                tokens["right" if mark else "wrong"].append(sample.tokens)
        for name, measure in MEASURES.items():
            scored = [(measure(s), m) for s, m in zip(question.samples, marks, strict=True)]
            good = [v for v, m in scored if v is not None and m]
            bad = [v for v, m in scored if v is not None and not m]
            pooled[name]["right"] += good
            pooled[name]["wrong"] += bad
            value = auroc(good, bad)
            if value is not None:
                within[name].append(value)
    per_question = samples / max(len(questions), 1)
    return {
        "questions": len(questions),
        "samples": samples,
        "samples_per_question": per_question,
        "accuracy": right / max(samples, 1),
        "finished": finished / max(samples, 1),
        f"sc@{round(per_question)}_error": sum(errors) / max(len(errors), 1),
        "mixed_questions": mixed,
        "mean_tokens": {k: sum(v) / len(v) if v else None for k, v in tokens.items()},
        "auroc_across": {m: auroc(p["right"], p["wrong"]) for m, p in pooled.items()},
        "auroc_within": {m: sum(v) / len(v) if v else None for m, v in within.items()},
        "questions_within": {m: len(v) for m, v in within.items()},
    }


def _table(figures: dict[str, Any]) -> str:
    lines = [
        f"questions {figures['questions']}, samples {figures['samples']} "
        f"({figures['samples_per_question']:.1f} a question)",
        f"accuracy of one sample {figures['accuracy']:.3f}; finished (not cut) "
        f"{figures['finished']:.3f}",
        *(f"{k} {v:.3f}" for k, v in figures.items() if k.startswith("sc@")),
        f"mean tokens: right {figures['mean_tokens']['right']}, "
        f"wrong {figures['mean_tokens']['wrong']}",
        f"questions with right and wrong samples: {figures['mixed_questions']}",
        "",
        "| measure | AUROC across samples | AUROC within a question | questions |",
        "|---|---:|---:|---:|",
    ]
    for name in MEASURES:
        across, inside = figures["auroc_across"][name], figures["auroc_within"][name]
        lines.append(
            f"| {name} | {_number(across)} | {_number(inside)} | "
            f"{figures['questions_within'][name]} |"
        )
    return "\n".join(lines)


def _number(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("recording", type=Path)
    parser.add_argument("--json", type=Path, help="write the figures as JSON here too")
    args = parser.parse_args(argv)
    try:
        questions = load(args.recording)
    except ValueError as exc:
        print(f"report: {exc}", file=sys.stderr)
        return 2
    if not questions:
        print(f"report: {args.recording}: no question has an answer key (gold)", file=sys.stderr)
        return 2
    figures = {"all": report(questions)}
    sets = sorted({q.id.split("-")[0] for q in questions})
    if len(sets) > 1:  # ids named "<set>-<n>": each set on its own too
        for name in sets:
            figures[name] = report([q for q in questions if q.id.split("-")[0] == name])
    for name, figure in figures.items():
        print(f"## {name}\n{_table(figure)}\n")
    if args.json is not None:
        args.json.write_text(json.dumps(figures, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
