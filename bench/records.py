"""Question sets shared by the benchmarks: recorded or synthetic, served as answer streams.

A :class:`Record` carries a question's distinct answers, its true mode first,
and their probabilities: the frequencies of its recorded answers (as the
simulator has them) or a synthetic family's distribution, exactly; from a
recording, each answer's recorded samples too. A :class:`StreamEngine` serves
them through the replay engine, drawing the simulator's answer streams and,
for each answer drawn, one of its recorded samples (its length, finish reason
and confidence as recorded); :class:`CountingReplayEngine` counts the engine
requests of every question (the rounds a question took).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import numpy as np
from blendserve.engines.base import GenerateRequest, Sample
from blendserve.engines.replay import LatencyModel, ReplayData, ReplayEngine
from blendserve.recordings.format import RecordedSample
from blendserve.sim.data import Dataset, load_jsonl
from blendserve.sim.runner import AnswerDraws
from blendserve.sim.synthetic import synthetic
from blendserve.stats import Stats
from numpy.typing import NDArray

__all__ = [
    "CountingReplayEngine",
    "Record",
    "StreamEngine",
    "load",
    "percentiles",
    "question_key",
    "synthetic_records",
]


@dataclass(frozen=True, eq=False)
class Record:
    """A kept question: its distinct answers, the true mode first, and their probabilities;
    from a recording, each answer's recorded ``samples`` in the same order (empty: none)."""

    id: str
    answers: tuple[str, ...]
    probs: NDArray[np.float64]
    samples: tuple[tuple[RecordedSample, ...], ...] = ()

    @property
    def mode(self) -> str:
        """The true most likely answer."""
        return self.answers[0]

    def distribution(self) -> tuple[list[str], NDArray[np.float64]]:
        """Distinct answers, the mode first, and their probabilities (as the simulator has them)."""
        return list(self.answers), self.probs


def load(path: Path) -> list[Record]:
    """The recorded questions the simulator keeps (enough non-null answers, a unique mode),
    read as the simulator reads them (:func:`~blendserve.sim.data.load_jsonl`: a recording
    or older answers), each answer with its recorded samples."""
    dataset = load_jsonl(path)
    assert dataset.recorded is not None
    return [
        Record(qid, tuple(str(samples[0].answer) for samples in answers), probs, answers)
        for qid, probs, answers in zip(dataset.ids, dataset.probs, dataset.recorded, strict=True)
    ]


def synthetic_records(family: str, num_questions: int = 300, seed: int = 0) -> list[Record]:
    """A synthetic family's questions; answer ``a0`` of each is its true mode.

    Questions whose drawn mode is tied are left out (as the simulator leaves
    them out), so there may be fewer than ``num_questions``.
    """
    dataset = synthetic(family, num_questions, seed)
    return [
        Record(f"{family}-{qid}", tuple(f"a{k}" for k in range(len(p))), p)
        for qid, p in zip(dataset.ids, dataset.probs, strict=True)
    ]


def percentiles(values: Sequence[float], qs: Sequence[float] = (50, 95)) -> list[float]:
    """The ``qs`` percentiles of ``values`` (NaN when there are none)."""
    if not values:
        return [float("nan")] * len(qs)
    return [float(v) for v in np.percentile(np.asarray(values, dtype=float), qs)]


def question_key(request: GenerateRequest) -> str:
    """What the benches ask by: the prompt, else the last message, else the question's id.

    ``/v1`` gives its questions ids of its own (not unique across grouped
    jobs); the benches send the record's id as the prompt or message.
    """
    if isinstance(request.prompt, str):
        return request.prompt
    if request.messages:
        return str(request.messages[-1].get("content"))
    return str(request.question_id)


class _PoolRounds:
    """A stats sink passing every report on, keeping the waves of each answered pool question."""

    def __init__(self, inner: Stats, rounds: list[int]) -> None:
        self._inner = inner
        self._rounds = rounds

    def pool_answered(self, pool: str, rounds: int, *args: Any) -> None:
        self._rounds.append(rounds)
        self._inner.pool_answered(pool, rounds, *args)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


class CountingReplayEngine(ReplayEngine):
    """The replay engine, counting the requests of each question (by :func:`question_key`).

    ``pool_rounds`` keeps the waves of every question an online pool over
    this engine answered (the pools report where the engine does).
    """

    def __init__(self, data: ReplayData, **kwargs: Any) -> None:
        self.requests_per_question: Counter[str] = Counter()
        self.pool_rounds: list[int] = []
        super().__init__(data, **kwargs)

    def report_to(self, sink: Stats) -> None:
        """Reports to ``sink``, keeping the pools' rounds on the way."""
        super().report_to(cast(Stats, _PoolRounds(sink, self.pool_rounds)))

    async def replay_stream(self, request: GenerateRequest, kind: str) -> AsyncIterator[Sample]:
        """Counts the request against its question, then serves it."""
        self.requests_per_question[question_key(request)] += 1
        async for sample in super().replay_stream(request, kind):
            yield sample


class StreamEngine(CountingReplayEngine):
    """The replay engine drawing the simulator's answer streams from :class:`Record` s.

    The k-th sample of question q is the k-th draw of :class:`AnswerDraws`
    for ``(seed, q)``, whatever the order of requests: every method, the
    simulator included, sees the same answers (common random numbers). Where
    the record holds the answer's recorded samples, it is one of them, picked
    by the k-th draw of a second stream for ``(seed, q)``, so that the same
    answers come with the same lengths too; where not, the answer alone (the
    engine's length model gives its length). A question is found by its prompt
    or last message, else by its id (as the replay engine finds it): ``/v1``
    requests carry ids of their own.
    """

    def __init__(self, records: list[Record], seed: int, latency: LatencyModel) -> None:
        super().__init__(
            [{"id": r.id, "answers": list(r.answers)} for r in records], latency=latency
        )
        self.dataset = Dataset("replay", [r.id for r in records], [r.probs for r in records])
        self._draws = AnswerDraws(self.dataset, seed)
        self._seed = seed
        # question index -> the generator picking its recorded samples
        self._picks: dict[int, np.random.Generator] = {}
        # question id -> its index
        self._index = {r.id: i for i, r in enumerate(records)}
        self._records = records

    def _draw(
        self, request: GenerateRequest, recorded: Sequence[RecordedSample]
    ) -> list[RecordedSample]:
        q = self._find(request)
        return [self._sample(q, self._draws.next(q)) for _ in range(request.n)]

    def _sample(self, q: int, answer: int) -> RecordedSample:
        """A recorded sample of question ``q``'s ``answer``-th answer, else the answer alone.
        A pick is drawn for every sample, so that the k-th of q is always the k-th pick."""
        record = self._records[q]
        if not record.samples:
            return RecordedSample(record.answers[answer])
        picks = self._picks.get(q)
        if picks is None:
            picks = self._picks[q] = np.random.default_rng((self._seed, q, 1))
        samples = record.samples[answer]
        return samples[min(int(picks.random() * len(samples)), len(samples) - 1)]

    def _find(self, request: GenerateRequest) -> int:
        for key in (question_key(request), request.question_id):
            if key is not None and key in self._index:
                return self._index[key]
        raise KeyError(f"no record for question {request.question_id!r}")
