"""A trace-level simulator: recorded samples, with their length and confidence, drawn
again under a trace rule, DeepConf's online and offline methods, and plain SC@k.

A question is its recorded samples (:class:`TraceSample`: answer key, completion tokens,
confidence with its trajectory, whether it is right). A run draws, per question, samples
uniformly with replacement from its recorded ones; the k-th draw of question q depends
only on ``(seed, q, k)`` (:class:`TraceDraws`), so every method sees the same samples.

- :func:`run_ours`: the default allocation policy, in waves as a batch job on an idle
  engine sends them, with a :class:`~blendserve.core.traces.TraceRule` and what a
  :class:`~blendserve.core.traces.TraceLearner` was taught beforehand: each vote weighs
  ``learner.weight``; with ``cut``, a sample whose replayed window confidence falls below
  ``learner.bar`` is cut there (charged the tokens read, no vote); with ``first_m``, a
  wave's ``m`` shortest samples vote and the rest are cut when the ``m``-th finishes.
- :func:`run_sc`: SC@k, ``k`` samples a question, counted.
- :func:`run_deepconf_offline`: ``k`` traces a question, the top ``eta`` percent by lowest
  group kept, voting by their confidence.
- :func:`run_deepconf_online`: warm-up traces set a bar; later traces, one at a time, are
  cut below it, until the confidence-weighted leader's share reaches ``tau``.

Each returns a :class:`TraceRun`: per question whether its answer was right, samples drawn,
completion tokens charged (a cut sample's up to its cut) and samples cut. Pure, besides
the explicit loader :func:`load_traces`.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from blendserve.answers import canonical_key
from blendserve.core.policies import DEFAULT_POLICY, PolicySpec
from blendserve.core.signals import Confidence
from blendserve.core.traces import TraceFacts, TraceLearner, TraceRule
from blendserve.core.waves import WavePlan
from blendserve.recordings.format import RecordedQuestion, merge, parse_record
from blendserve.util.jsonl import read_jsonl

__all__ = [
    "TraceDraws",
    "TraceQuestion",
    "TraceRun",
    "TraceSample",
    "cut_point",
    "deepconf_bar",
    "deepconf_kept",
    "deepconf_warmup",
    "learner_from",
    "load_traces",
    "run_deepconf_offline",
    "run_deepconf_online",
    "run_ours",
    "run_sc",
    "trace_questions",
    "weighted_leader",
]

#: Draws made at a time per question (fixed, so that a draw depends only on its index).
_CHUNK = 64


@dataclass(frozen=True)
class TraceSample:
    """One recorded sample: its answer ``key`` (None: it gave none, it abstains), its
    completion ``tokens``, ``confidence`` (None: not recorded), whether it is ``right``,
    and its replayed window confidence (``windows``: tokens read, window confidence)."""

    key: str | None
    tokens: int
    confidence: Confidence | None
    right: bool
    windows: tuple[tuple[int, float], ...] = ()


@dataclass(frozen=True)
class TraceQuestion:
    """A question: its ``id``, recorded ``samples``, the ``gold`` key its answers are
    judged by, and ``plurality``, the most common answer of all its samples."""

    id: str
    samples: tuple[TraceSample, ...]
    gold: str | None
    plurality: str | None


def _windows(confidence: Confidence | None) -> tuple[tuple[int, float], ...]:
    if confidence is None or not confidence.block or not confidence.window:
        return ()
    return tuple(confidence.windows(max(1, confidence.window // confidence.block)))


def trace_questions(records: Iterable[RecordedQuestion]) -> list[TraceQuestion]:
    """Recorded questions made simulator questions. A sample is right where its answer is
    the question's ``gold`` keyed by its ``answer_format`` (``auto`` if absent), or, with
    no gold, the plurality answer of its samples. A sample with no recorded tokens counts
    none; one with no answer is kept (it is drawn, spends and abstains)."""
    questions = []
    for record in merge(records):
        counts = Counter(s.answer for s in record.samples if s.answer is not None)
        plurality = counts.most_common(1)[0][0] if counts else None
        if record.gold is not None:
            gold: str | None = canonical_key(record.gold, record.extra.get("answer_format", "auto"))
        else:
            gold = plurality
        samples = tuple(
            TraceSample(
                key=s.answer,
                tokens=s.tokens or 0,
                confidence=s.confidence,
                right=s.answer is not None and s.answer == gold,
                windows=_windows(s.confidence),
            )
            for s in record.samples
        )
        if samples:
            questions.append(TraceQuestion(record.id, samples, gold, plurality))
    return questions


def load_traces(path: Path) -> list[TraceQuestion]:
    """The questions of the recording at ``path`` (see :func:`trace_questions`).

    Raises:
        ValueError: a line that is not a recording line.
    """
    records = [parse_record(value, f"{path}:{n}") for n, value in read_jsonl(path, "recording")]
    return trace_questions(records)


def learner_from(questions: Iterable[TraceQuestion]) -> TraceLearner:
    """A learner taught by earlier traffic: each question's answering samples, labelled by
    agreement with the question's plurality answer (no gold is read)."""
    learner = TraceLearner()
    for question in questions:
        facts = [
            TraceFacts(s.tokens, s.confidence, s.key == question.plurality)
            for s in question.samples
            if s.key is not None
        ]
        if facts:
            learner.learn(facts)
    return learner


class TraceDraws:
    """Per question, recorded samples drawn uniformly with replacement; the k-th draw of
    question q depends only on ``(seed, q, k)``."""

    def __init__(self, questions: Sequence[TraceQuestion], seed: int) -> None:
        self._questions = questions
        self._seed = seed
        self._buffers: list[list[int]] = [[] for _ in questions]
        self._gens: list[np.random.Generator | None] = [None] * len(questions)
        self.drawn = [0] * len(questions)

    def index(self, q: int, k: int) -> int:
        """The recorded sample index of question ``q``'s ``k``-th draw (from 0)."""
        buffer = self._buffers[q]
        while len(buffer) <= k:
            gen = self._gens[q]
            if gen is None:
                gen = self._gens[q] = np.random.default_rng((self._seed, q))
            buffer += gen.integers(0, len(self._questions[q].samples), _CHUNK).tolist()
        return buffer[k]

    def next(self, q: int) -> TraceSample:
        """Question ``q``'s next drawn sample."""
        k = self.drawn[q]
        self.drawn[q] = k + 1
        return self._questions[q].samples[self.index(q, k)]


def cut_point(sample: TraceSample, bar: float | None) -> int | None:
    """The tokens read when ``sample``'s replayed window confidence first falls below
    ``bar`` (None: it never does, or no bar)."""
    if bar is None:
        return None
    for read, value in sample.windows:
        if value < bar:
            return read
    return None


@dataclass
class TraceRun:
    """One run over a question set: per question whether its answer is ``right``, the
    ``samples`` drawn, completion ``tokens`` charged, and samples ``cut`` (by confidence
    or by ``first_m``)."""

    right: list[bool]
    samples: list[int]
    tokens: list[int]
    cut: list[int]

    @classmethod
    def empty(cls, num_questions: int) -> TraceRun:
        """A run that has drawn nothing yet."""
        return cls(
            [False] * num_questions, [0] * num_questions, [0] * num_questions, [0] * num_questions
        )

    @property
    def error(self) -> float:
        """The share of questions whose answer is wrong."""
        return 1.0 - sum(self.right) / len(self.right)

    @property
    def samples_per_question(self) -> float:
        """Mean samples drawn per question."""
        return sum(self.samples) / len(self.samples)

    @property
    def tokens_per_question(self) -> float:
        """Mean completion tokens charged per question."""
        return sum(self.tokens) / len(self.tokens)

    @property
    def num_cut(self) -> int:
        """Samples cut in all."""
        return sum(self.cut)


def _is_right(question: TraceQuestion, answer: object) -> bool:
    return answer is not None and answer == question.gold


def run_sc(questions: Sequence[TraceQuestion], k: int, seed: int) -> TraceRun:
    """SC@k: ``k`` draws a question, every answer counting one (a tie goes to the answer
    that reached the top count first)."""
    draws = TraceDraws(questions, seed)
    run = TraceRun.empty(len(questions))
    for q, question in enumerate(questions):
        counts: Counter[str] = Counter()
        leader, top = None, 0
        for _ in range(k):
            sample = draws.next(q)
            run.tokens[q] += sample.tokens
            if sample.key is not None:
                counts[sample.key] += 1
                if counts[sample.key] > top:
                    leader, top = sample.key, counts[sample.key]
        run.samples[q] = k
        run.right[q] = _is_right(question, leader)
    return run


def run_ours(
    questions: Sequence[TraceQuestion],
    rule: TraceRule,
    learner: TraceLearner,
    budget: int,
    seed: int,
    policy: str = DEFAULT_POLICY,
    plan: WavePlan | None = None,
) -> TraceRun:
    """The allocation ``policy`` (one that plans waves; the default) spending ``budget``
    samples a question on average, in the waves of ``plan``, under ``rule`` with what
    ``learner`` was taught (it learns nothing during the run).

    A wave's samples are drawn together. One whose window confidence falls below the
    learner's bar is cut there. With ``first_m``, the wave's ``m`` shortest uncut samples
    vote and the others stop when the ``m``-th finishes, charged its length (or their cut,
    if earlier). Every sample is observed: cut ones as abstentions; voters weighing
    ``learner.weight``.
    """
    num_questions = len(questions)
    spec = PolicySpec.parse(policy)
    allocation = spec.build(num_questions, budget * num_questions, seed=seed)
    plan = plan or WavePlan()
    draws = TraceDraws(questions, seed)
    run = TraceRun.empty(num_questions)
    bar = learner.bar(rule)
    rounds = [0] * num_questions
    voters: list[list[tuple[str, int, Confidence | None]]] = [[] for _ in questions]
    sizes = allocation.plan_waves(plan, rounds)
    while sizes:
        sent = [(q, allocation.assign(q, k)) for q, k in sizes.items()]
        if not any(k for _, k in sent):
            break
        for q, k in sent:
            rounds[q] += 1
            for sample, key, weight, tokens, cut in _wave(draws, q, k, rule, learner, bar):
                allocation.observe(q, key, weight)
                run.tokens[q] += tokens
                run.cut[q] += cut
                if key is not None:
                    voters[q].append((key, sample.tokens, sample.confidence))
            run.samples[q] += k
        sizes = allocation.plan_waves(plan, rounds)
    for q, question in enumerate(questions):
        kept = learner.kept_answer(rule, voters[q])
        leader = kept if kept is not None else allocation.votes.leaders[q]
        run.right[q] = _is_right(question, leader)
    return run


def _wave(
    draws: TraceDraws,
    q: int,
    k: int,
    rule: TraceRule,
    learner: TraceLearner,
    bar: float | None,
) -> list[tuple[TraceSample, str | None, float, int, bool]]:
    """A wave of ``k`` samples of ``q``: each sample, its vote key, weight, tokens charged
    and whether it was cut."""
    wave = [draws.next(q) for _ in range(k)]
    cuts = [cut_point(s, bar) for s in wave]
    ends = [s.tokens if c is None else c for s, c in zip(wave, cuts, strict=True)]
    stop_at = math.inf
    voters = set(i for i, c in enumerate(cuts) if c is None)
    first_m = learner.first_m(rule)
    if first_m is not None:
        finishing = sorted(voters, key=lambda i: (wave[i].tokens, i))
        if len(finishing) > first_m:
            stop_at = wave[finishing[first_m - 1]].tokens
            voters = set(finishing[:first_m])
    out = []
    for i, sample in enumerate(wave):
        charged = int(min(ends[i], stop_at))
        if i in voters:
            weight = learner.weight(rule, sample.tokens, sample.confidence)
            out.append((sample, sample.key, weight, charged, False))
        else:
            out.append((sample, None, 1.0, charged, True))
    return out


def _confidence(sample: TraceSample) -> float:
    if sample.confidence is None:
        raise ValueError("DeepConf needs every sample's confidence")
    return sample.confidence.lowest_group


def _weighted_leader(votes: Iterable[tuple[str | None, float]]) -> tuple[str | None, float]:
    """The answer with the largest summed weight (first to reach it on a tie) and its share
    of all the weight (0: no vote)."""
    totals: dict[str, float] = {}
    leader, top = None, -math.inf
    for key, weight in votes:
        if key is None:
            continue
        totals[key] = totals.get(key, 0.0) + weight
        if totals[key] > top:
            leader, top = key, totals[key]
    whole = math.fsum(totals.values())
    return leader, (top / whole if whole > 0 else 0.0)


def weighted_leader(votes: Iterable[tuple[str | None, float]]) -> tuple[str | None, float]:
    """The answer with the largest summed weight among ``votes`` (key, weight; a None key
    abstains), the first to reach it on a tie, and its share of all the weight (0: no
    vote): DeepConf's vote and its consensus."""
    return _weighted_leader(votes)


def deepconf_kept(confidences: Sequence[float], eta: float) -> list[int]:
    """DeepConf offline's filter: the indices, in order, of the top ``eta`` percent (at
    least one) of traces by ``confidences`` (their lowest groups), ties to the earlier."""
    keep = max(1, math.ceil(len(confidences) * eta / 100.0 - 1e-9))
    return sorted(sorted(range(len(confidences)), key=lambda i: (-confidences[i], i))[:keep])


def deepconf_bar(confidences: Sequence[float], eta: float) -> float:
    """DeepConf online's bar from its warm-up traces' lowest groups: their ``100 - eta``
    percentile (eta 10: DeepConf-low, the top tenth pass; 90: DeepConf-high)."""
    return float(np.percentile(confidences, 100.0 - eta))


def run_deepconf_offline(
    questions: Sequence[TraceQuestion], k: int, eta: float, seed: int
) -> TraceRun:
    """DeepConf offline: ``k`` traces a question run to their end; the top ``eta`` percent
    by lowest-group confidence (at least one) vote, each weighing its lowest group."""
    draws = TraceDraws(questions, seed)
    run = TraceRun.empty(len(questions))
    for q, question in enumerate(questions):
        traces = [draws.next(q) for _ in range(k)]
        kept = deepconf_kept([_confidence(t) for t in traces], eta)
        leader, _ = _weighted_leader((traces[i].key, _confidence(traces[i])) for i in kept)
        run.samples[q] = k
        run.tokens[q] = sum(t.tokens for t in traces)
        run.right[q] = _is_right(question, leader)
    return run


def deepconf_warmup(budget: int) -> int:
    """DeepConf online's warm-up traces under a cap of ``budget`` traces: its 16, or half
    the cap where that is smaller (at least 2), so that some of the cap is left online."""
    return max(1, min(16, budget, max(2, budget // 2)))


def run_deepconf_online(
    questions: Sequence[TraceQuestion],
    budget: int,
    eta: float,
    seed: int,
    tau: float = 0.95,
    warmup: int | None = None,
) -> TraceRun:
    """DeepConf online, per question: ``warmup`` traces (:func:`deepconf_warmup` if None)
    run to their end; the bar is the ``100 - eta`` percentile of their lowest groups (eta
    10: DeepConf-low, 90: DeepConf-high). Then one trace at a time, cut where its window
    confidence first falls below the bar (charged to the cut, no vote), until the
    confidence-weighted leader's share reaches ``tau`` or ``budget`` traces were drawn.
    The answer: the confidence-weighted vote of the warm-up traces at or above the bar and
    of the later traces not cut. The consensus is checked after the warm-up too."""
    draws = TraceDraws(questions, seed)
    run = TraceRun.empty(len(questions))
    first = warmup if warmup is not None else deepconf_warmup(budget)
    for q, question in enumerate(questions):
        traces = [draws.next(q) for _ in range(first)]
        bar = deepconf_bar([_confidence(t) for t in traces], eta)
        votes = [(t.key, _confidence(t)) for t in traces if _confidence(t) >= bar]
        tokens = sum(t.tokens for t in traces)
        drawn, cut = first, 0
        while drawn < budget and _weighted_leader(votes)[1] < tau:
            trace = draws.next(q)
            drawn += 1
            stop = cut_point(trace, bar)
            if stop is None:
                tokens += trace.tokens
                votes.append((trace.key, _confidence(trace)))
            else:
                tokens += stop
                cut += 1
        run.samples[q], run.tokens[q], run.cut[q] = drawn, tokens, cut
        run.right[q] = _is_right(question, _weighted_leader(votes)[0])
    return run
