"""The replay engine: our own fake model that serves recorded answers (docs/engines.md).

A test double for schedulers, benchmarks, fault tests and demos: for a question it draws
(with replacement) one of the samples recorded for it and renders a short completion of
its answer in the answer format asked for, so extraction and voting run exactly as in
production. A recording's lengths, finish and stop reasons and confidences are served as
recorded (:mod:`blendserve.recordings.format`); a latency and capacity model imitates an
engine's batch, fault injection a bad upstream.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import time
from collections import deque
from collections.abc import AsyncGenerator, AsyncIterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from blendserve.core.signals import Confidence
from blendserve.core.traces import LOW_CONFIDENCE
from blendserve.engines.base import Engine, EngineHealth, EngineLoad, GenerateRequest, Sample
from blendserve.engines.continuous import ContinuousBatch
from blendserve.engines.step_cost import StepCost
from blendserve.errors import EngineProtocolError, EngineTimeout, EngineUnavailable
from blendserve.recordings.format import RecordedQuestion, RecordedSample, merge, parse_record
from blendserve.stats import NO_STATS, Stats, UpstreamOutcome
from blendserve.util.jsonl import read_jsonl

__all__ = [
    "LENGTHS",
    "FaultConfig",
    "LatencyModel",
    "ReplayData",
    "ReplayEngine",
    "ReplayStats",
    "cut_point",
    "render",
]

#: Sample lengths by name, as ``LatencyModel.length``: the rendered text's words; chain of
#: thought (lognormal(5.58, 0.30), about 265 tokens); a reasoning model (about 2,100).
LENGTHS: dict[str, tuple[float, float] | None] = {
    "text": None,
    "cot": (5.58, 0.30),
    "reasoning": (7.66, 0.50),
}

_CHARS_PER_TOKEN = 4  # English text, about, in the usual BPE vocabularies
_REASONING = "Let me work through this step by step and check each part of the question."


@dataclass(frozen=True)
class LatencyModel:
    """How long a request takes and how many sequences run at once.

    A request lasts ``fixed`` seconds plus ``per_token`` per completion token of its longest
    sample (its sequences run together), plus an exponential delay of mean
    ``exponential_mean`` seconds (seeded; 0: none); ``max_concurrent_sequences`` run at
    once like a GPU batch (None: unlimited), a request for n samples holding n. ``length``:
    the completion tokens of a sample recorded without them, log-normal with ``(mu,
    sigma)`` of their logarithm (seeded; None: the rendered text's words); a sample recorded
    with its tokens lasts those. A ``step_cost`` prices decode steps by width
    and context instead: the engine batches continuously
    (:class:`~blendserve.engines.continuous.ContinuousBatch`), each sample lasting its own
    tokens. ``time_scale`` multiplies each modelled step's time.
    """

    fixed: float = 0.0
    per_token: float = 0.0
    exponential_mean: float = 0.0
    max_concurrent_sequences: int | None = None
    length: tuple[float, float] | None = None
    step_cost: StepCost | None = None
    time_scale: float = 1.0


@dataclass(frozen=True)
class FaultConfig:
    """Rates of injected faults per request (seeded, independent of the answers): the request
    fails (``error_rate``: an upstream 5xx), hangs until its deadline or cancellation
    (``timeout_rate``), loses its connection with no response (``drop_rate``), or takes
    ``slow_factor`` times longer (``slow_rate``)."""

    error_rate: float = 0.0
    timeout_rate: float = 0.0
    drop_rate: float = 0.0
    slow_rate: float = 0.0
    slow_factor: float = 5.0


@dataclass
class ReplayStats:
    """Counters that tests and benchmarks read: nothing lost, nothing twice."""

    requests: int = 0
    samples: int = 0
    failures: int = 0
    in_flight: int = 0
    sequences_in_flight: int = 0
    max_sequences_in_flight: int = 0


def render(answer: str | None, kind: str) -> tuple[str, str]:
    """A completion whose extracted answer (of ``kind``) is ``answer``, and its finish reason
    (``None``: a truncated completion with no answer, finish reason ``length``)."""
    if answer is None:
        return f"{_REASONING} First we note that the", "length"
    if kind == "math":
        return f"{_REASONING} Simplifying, the final answer is $\\boxed{{{answer}}}$.", "stop"
    if kind == "choice":
        return f"{_REASONING} Comparing the options, Answer: ({answer})", "stop"
    if kind == "exact":
        return answer, "stop"
    if kind == "regex":
        return f"{_REASONING}\nAnswer: {answer}", "stop"
    return f"{_REASONING} Putting it together, the answer is {answer}.", "stop"


def cut_point(confidence: Confidence | None, window: int, bar: float | None) -> int | None:
    """The tokens a recorded trace had read when its window confidence first fell below
    ``bar``, replayed from its trajectory (:meth:`Confidence.windows`); None: it never
    does, or it cannot be replayed: no bar, no trajectory, or a recorded window other than
    ``window`` (the request's), or not whole blocks of it."""
    if bar is None or confidence is None or not confidence.groups:
        return None
    if confidence.window != window or window % confidence.block:
        return None
    for read, value in confidence.windows(window // confidence.block):
        if value < bar:
            return read
    return None


def _cut_confidence(confidence: Confidence, read: int, tail: int) -> Confidence:
    """``confidence`` as it stood after ``read`` tokens (a block boundary, or its end): the
    mean of its blocks so far, the lowest window so far, the mean of its last ``tail``
    tokens' blocks (whole blocks: the trajectory is no finer)."""
    blocks = confidence.window // confidence.block
    kept = -(-read // confidence.block)
    groups = confidence.groups[:kept]
    sizes = [confidence.block] * kept
    sizes[-1] = read - confidence.block * (kept - 1)
    mean = sum(g * n for g, n in zip(groups, sizes, strict=True)) / read
    lowest = min(value for at, value in confidence.windows(blocks) if at <= read)
    last = max(1, min(kept, -(-tail // confidence.block)))
    tail_mean = sum(g * n for g, n in zip(groups[-last:], sizes[-last:], strict=True)) / sum(
        sizes[-last:]
    )
    return Confidence(
        mean, lowest, tail_mean, read, confidence.window, confidence.block, tuple(groups)
    )


#: What replay data may be: a recording's path, its lines, or its questions read.
ReplayData = str | Path | Sequence[Mapping[str, Any] | RecordedQuestion]


def _load(data: ReplayData) -> list[RecordedQuestion]:
    """The recorded questions of ``data``, lines of one id merged; a line without an id is
    named by its index among the lines."""
    if isinstance(data, (str, Path)):
        lines: list[tuple[str, Any]] = [
            (f"{data}:{lineno}", record) for lineno, record in read_jsonl(Path(data), "replay data")
        ]
    else:
        lines = [(f"replay record {i}", record) for i, record in enumerate(data)]
    questions = []
    for i, (where, record) in enumerate(lines):
        if isinstance(record, RecordedQuestion):
            questions.append(record)
            continue
        if isinstance(record, Mapping):
            record = {"id": i, **record}
        questions.append(parse_record(record, where))
    return merge(questions)


def _prompt_key(prompt: str | Sequence[int]) -> str:
    """A text prompt as is; token ids as their JSON list (``[1, 2, 3]``)."""
    return prompt if isinstance(prompt, str) else json.dumps(list(prompt))


def _prompt_keys(question: RecordedQuestion) -> list[str]:
    """What a request may find ``question`` by besides its id: its prompt (recorded as text or
    as token ids, ``prompt`` or ``question``) and its last message's text content."""
    keys = [] if question.prompt is None else [question.prompt]
    alias = question.extra.get("question")
    if isinstance(alias, str) or (
        isinstance(alias, list) and all(isinstance(t, int) for t in alias)
    ):
        keys.append(_prompt_key(alias))
    if question.messages:
        content = question.messages[-1].get("content")
        if isinstance(content, str):
            keys.append(content)
    return keys


def _prompt_tokens(prompt: str | Sequence[int]) -> int:
    """A prompt's tokens: token ids counted, text at about four characters a token."""
    return -(-len(prompt) // _CHARS_PER_TOKEN) if isinstance(prompt, str) else len(prompt)


class _Batch:
    """The sequences a replay engine serves at once, like a GPU batch: a request's n start
    together (all-or-nothing, so no deadlock), in arrival order, like an engine's waiting
    queue. A waiter cancelled in the loop iteration that frees its sequences is passed
    over, or gives back what it was handed: whatever the order, no sequence is lost."""

    def __init__(self, latency: LatencyModel, stats: ReplayStats) -> None:
        self.limit = latency.max_concurrent_sequences
        self.free = self.limit
        self.stats = stats
        # requests waiting for sequences, first come first served: (sequences, wake-up)
        self.waiting: deque[tuple[int, asyncio.Future[None]]] = deque()

    async def run(self, n: int, delay: float) -> None:
        """Holds ``n`` sequences for ``delay`` seconds, once they are free."""
        need = min(n, self.limit or n)
        if self.free is not None:
            if self.waiting or self.free < need:
                wake: asyncio.Future[None] = asyncio.get_running_loop().create_future()
                self.waiting.append((need, wake))
                try:
                    await wake
                except asyncio.CancelledError:
                    if wake.done() and not wake.cancelled():
                        self._release(need)  # granted just as it was cancelled
                    else:
                        with contextlib.suppress(ValueError):  # a release passed it over
                            self.waiting.remove((need, wake))
                        self._release(0)  # the next in line may fit now
                    raise
            else:
                self.free -= need
        stats = self.stats
        stats.sequences_in_flight += n
        stats.max_sequences_in_flight = max(
            stats.max_sequences_in_flight, stats.sequences_in_flight
        )
        try:
            await asyncio.sleep(delay)
        finally:
            stats.sequences_in_flight -= n
            if self.free is not None:
                self._release(need)

    def load(self) -> EngineLoad:
        """The batch's capacity, the sequences it runs and those waiting for room."""
        if self.limit is None or self.free is None:
            return EngineLoad(None, self.stats.sequences_in_flight)
        waiting = sum(need for need, wake in self.waiting if not wake.done())
        return EngineLoad(self.limit, self.limit - self.free, waiting)

    def _release(self, sequences: int) -> None:
        """Frees ``sequences`` and starts waiting requests, in order, while they fit; a waiter
        already cancelled (its task not yet run) is dropped, not handed sequences it could
        never give back."""
        assert self.free is not None
        self.free += sequences
        while self.waiting:
            need, wake = self.waiting[0]
            if wake.done():
                self.waiting.popleft()
            elif need <= self.free:
                self.waiting.popleft()
                self.free -= need
                wake.set_result(None)
            else:
                break


class ReplayEngine(Engine):
    """Serves recorded samples by question id, else by exact prompt (or the last recorded
    message's content).

    ``data`` is a recording (a JSONL file, :mod:`blendserve.recordings.format`: ``{"id",
    "samples": [...]}`` or the older ``{"id", "answers": [...]}`` per line, optional
    ``prompt``/``question``, a prompt given as a string or as token ids; lines of one id
    are one question), its lines or its questions read. A drawn sample's answer is
    rendered (:func:`render`); its recorded ``tokens`` are its completion tokens (else the
    latency model's ``length``), its recorded finish reason (else the rendering's) and stop
    reason are its own, and its recorded confidence is served where the request asks for
    confidences. A request's ``cut_below`` cuts a sample recorded with its trajectory where
    its replayed window first falls below it (:func:`cut_point`; the request's window must
    be the recorded one, else nothing is cut): it is served with finish reason
    :data:`~blendserve.core.traces.LOW_CONFIDENCE`, no answer in its text, the tokens read
    then and its confidence so far, and the modelled clocks charge only those tokens.
    ``seed`` seeds the draws (a request's own ``seed`` overrides it);
    ``latency`` is zero by default; ``sink`` gets its samples and latencies as upstream
    ``replay``; ``answer_kind`` is the extractor its completions are written for
    (:meth:`rendering` gives the same engine for another).

    Raises:
        ValueError: unreadable data, a malformed line (named) or a question without samples.
    """

    name = "replay"

    def __init__(
        self,
        data: ReplayData,
        *,
        seed: int = 0,
        latency: LatencyModel | None = None,
        faults: FaultConfig | None = None,
        model_name: str = "replay",
        sink: Stats = NO_STATS,
        answer_kind: str = "auto",
    ) -> None:
        # question id, prompt or last message -> recorded samples
        self._samples: dict[str, tuple[RecordedSample, ...]] = {}
        for question in _load(data):
            samples = question.samples
            if not samples:
                raise ValueError(f"replay question {question.id!r} has no recorded samples")
            self._samples[question.id] = samples
            for key in _prompt_keys(question):
                self._samples.setdefault(key, samples)
        self.latency = latency or LatencyModel()
        self.faults = faults or FaultConfig()
        self.model_name = model_name
        self.stats = ReplayStats()
        self.report_to(sink)
        self._rng = random.Random(seed)
        self._fault_rng = random.Random(seed + 1)
        self._delay_rng = random.Random(seed + 2)
        self._batch = _Batch(self.latency, self.stats)
        cost = self.latency.step_cost
        self._continuous = (
            None
            if cost is None
            else ContinuousBatch(
                cost, self.latency.max_concurrent_sequences, self.latency.time_scale
            )
        )
        self.answer_kind = answer_kind
        # Continuous batching ends each sample at its own time; the wave model all together.
        self.delivers_each = self._continuous is not None

    def rendering(self, kind: str) -> Engine:
        """This engine writing its answers for the ``kind`` extractor: a view with no state of
        its own, so jobs of different answer formats share one batch and its counters."""
        return _Rendering(self, kind)

    def load(self) -> EngineLoad:
        """The modelled batch's load: its capacity, sequences running and waiting."""
        if self._continuous is not None:
            return self._continuous.load()
        return self._batch.load()

    def report_to(self, sink: Stats) -> None:
        """Reports to ``sink`` from now on, starting with its one healthy upstream."""
        self.sink = sink
        sink.upstream_health(self.name, 1)
        sink.upstream_configured(self.name)

    def _lookup(self, request: GenerateRequest) -> tuple[RecordedSample, ...]:
        keys = [request.question_id]
        if request.prompt is not None:
            keys.append(_prompt_key(request.prompt))
        if request.messages:
            keys.append(str(request.messages[-1].get("content")))
        for key in keys:
            if key is not None and key in self._samples:
                return self._samples[key]
        raise EngineProtocolError(f"replay has no recorded answers for {keys[0] or keys[-1]!r}")

    async def generate(self, request: GenerateRequest) -> list[Sample]:
        """Draws ``request.n`` recorded samples and renders them in its answer format."""
        return await self.replay(request, self.answer_kind)

    async def replay(self, request: GenerateRequest, kind: str) -> list[Sample]:
        """``request.n`` recorded samples rendered for ``kind``, once the last has ended."""
        return [sample async for sample in self.replay_stream(request, kind)]

    async def stream(self, request: GenerateRequest) -> AsyncGenerator[Sample, None]:
        """Each drawn sample as its modelled time ends (see :meth:`replay_stream`)."""
        async for sample in self.replay_stream(request, self.answer_kind):
            yield sample

    async def replay_stream(self, request: GenerateRequest, kind: str) -> AsyncIterator[Sample]:
        """``request.n`` recorded samples rendered for ``kind``, each as its modelled time ends
        (under a step-cost profile each its own, by its tokens; otherwise all together, after
        the request's modelled delay). Every request comes through here, from
        :meth:`generate`, :meth:`stream` or a :meth:`rendering`: the place for a test double
        to hook."""
        recorded = self._lookup(request)
        drawn = self._draw(request, recorded)
        self.stats.requests += 1
        self.stats.in_flight += 1
        self.sink.upstream_samples(self.name, "dispatched", request.n)
        started = time.monotonic()
        outcome: UpstreamOutcome = "failed"
        try:
            await self._fault(request)
            texts = [render(s.answer, kind) for s in drawn]
            tokens = self._lengths(drawn, texts)
            text = request.prompt if request.prompt is not None else str(request.messages)
            prompt_tokens = _prompt_tokens(text)
            samples = [
                self._served(request, recorded, rendered, count, prompt_tokens, kind)
                for recorded, rendered, count in zip(drawn, texts, tokens, strict=True)
            ]
            tokens = [sample.completion_tokens for sample in samples]  # a cut one's read
            if self._continuous is not None:
                ends = self._continuous.ends(prompt_tokens, tokens, _prompt_key(text))
                async with contextlib.aclosing(ends):
                    async for i in ends:
                        self.stats.samples += 1
                        yield samples[i]
            else:
                await self._batch.run(request.n, self._delay(tokens))
                for sample in samples:
                    self.stats.samples += 1
                    yield sample
            outcome = "completed"
            self.sink.upstream_latency(self.name, time.monotonic() - started)
        except (asyncio.CancelledError, GeneratorExit):
            outcome = "cancelled"
            raise
        finally:
            self.stats.in_flight -= 1
            self.sink.upstream_samples(self.name, outcome, request.n)

    def _served(
        self,
        request: GenerateRequest,
        recorded: RecordedSample,
        rendered: tuple[str, str],
        tokens: int,
        prompt_tokens: int,
        kind: str,
    ) -> Sample:
        """A drawn sample as served: as recorded, or cut where ``request.cut_below`` says."""
        spec = request.confidence
        # Like a real engine, confidences only where the request asked for logprobs.
        confidence = recorded.confidence if spec is not None else None
        window = 0 if spec is None else spec.window
        read = cut_point(confidence, window, request.cut_below)
        if confidence is not None and spec is not None and read is not None and read < tokens:
            cut = _cut_confidence(confidence, read, spec.tail)
            text = render(None, kind)[0]  # no answer: the trace never reached one
            return Sample(text, LOW_CONFIDENCE, prompt_tokens, read, self.name, confidence=cut)
        text, finish = rendered
        return Sample(
            text,
            recorded.finish or finish,
            prompt_tokens,
            tokens,
            self.name,
            stop_reason=recorded.stop,
            confidence=confidence,
        )

    def _delay(self, tokens: list[int]) -> float:
        """Seconds a request of samples of ``tokens`` lasts under the fixed-wave model."""
        delay = self.latency.fixed + self.latency.per_token * max(tokens)
        if self.latency.exponential_mean > 0:
            delay += self._delay_rng.expovariate(1.0 / self.latency.exponential_mean)
        if self._fault_rng.random() < self.faults.slow_rate:
            delay *= self.faults.slow_factor
        return delay

    def _draw(
        self, request: GenerateRequest, recorded: Sequence[RecordedSample]
    ) -> list[RecordedSample]:
        """The ``request.n`` recorded samples to serve, drawn with replacement."""
        seed = request.params.seed
        rng = self._rng if seed is None else random.Random(seed)
        return [rng.choice(recorded) for _ in range(request.n)]

    def _lengths(
        self, drawn: Sequence[RecordedSample], texts: Sequence[tuple[str, str]]
    ) -> list[int]:
        """Completion tokens of each sample: as recorded; where not, the length model's (drawn
        for those samples alone), else the rendered text's words."""
        length = self.latency.length
        tokens = []
        for recorded, (text, _) in zip(drawn, texts, strict=True):
            if recorded.tokens is not None:
                tokens.append(recorded.tokens)
            elif length is None:
                tokens.append(len(text.split()))
            else:
                mu, sigma = length
                tokens.append(max(1, round(self._delay_rng.lognormvariate(mu, sigma))))
        return tokens

    async def _fault(self, request: GenerateRequest) -> None:
        roll = self._fault_rng.random()
        faults = self.faults
        if roll < faults.error_rate:
            self.stats.failures += 1
            raise EngineUnavailable("replay: injected upstream error")
        roll -= faults.error_rate
        if roll < faults.drop_rate:
            self.stats.failures += 1
            raise EngineUnavailable("replay: injected dropped connection")
        roll -= faults.drop_rate
        if roll < faults.timeout_rate:
            self.stats.failures += 1
            if request.timeout is None:
                await asyncio.Event().wait()  # hangs until cancelled, like a stuck upstream
            await asyncio.sleep(request.timeout or 0)
            raise EngineTimeout(f"replay: injected timeout after {request.timeout} s")

    async def health(self) -> EngineHealth:
        """Always healthy (faults are per request)."""
        return EngineHealth(True, {self.name: True})

    async def models(self) -> list[str]:
        """The configured model name."""
        return [self.model_name]


class _Rendering(Engine):
    """A replay engine as jobs of one answer format see it."""

    def __init__(self, engine: ReplayEngine, kind: str) -> None:
        self.engine = engine
        self.kind = kind
        self.name = engine.name
        self.sink = engine.sink

    def report_to(self, sink: Stats) -> None:
        """Reports the engine to ``sink`` from now on."""
        self.engine.report_to(sink)
        self.sink = sink

    @property
    def delivers_each(self) -> bool:  # type: ignore[override]
        """Whether the engine hands each sample over as it ends."""
        return self.engine.delivers_each

    async def generate(self, request: GenerateRequest) -> list[Sample]:
        """The engine's samples, rendered for this view's answer format."""
        return await self.engine.replay(request, self.kind)

    async def stream(self, request: GenerateRequest) -> AsyncGenerator[Sample, None]:
        """The engine's samples as each ends, rendered for this view's answer format."""
        async for sample in self.engine.replay_stream(request, self.kind):
            yield sample

    def load(self) -> EngineLoad:
        """The engine's load."""
        return self.engine.load()

    async def health(self) -> EngineHealth:
        """The engine's health."""
        return await self.engine.health()

    async def models(self) -> list[str]:
        """The engine's models."""
        return await self.engine.models()
