"""The engine contract: where samples come from, whatever serves them."""

from __future__ import annotations

import contextlib
from abc import ABC, abstractmethod
from collections.abc import AsyncGenerator, AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, final

from blendserve.core.answers.thoughts import (
    DEFAULT_REASONING_TAGS,
    ReasoningTags,
    Thought,
    read_thought,
)
from blendserve.core.signals import Confidence, ConfidenceSpec
from blendserve.errors import EngineDown
from blendserve.stats import NO_STATS, Stats

if TYPE_CHECKING:
    from blendserve.engines.engine_cost import EngineCost

__all__ = [
    "SEED_MAX",
    "SEED_MIN",
    "Engine",
    "EngineHealth",
    "GenerateRequest",
    "Sample",
    "SamplingParams",
    "UpstreamReply",
    "shift_seed",
]

#: The seeds a request may carry: 64-bit signed, as vLLM takes them.
SEED_MIN = -(2**63)
SEED_MAX = 2**63 - 1


def shift_seed(seed: int, by: int) -> int:
    """``seed + by``, wrapped around within the 64-bit seeds (``SEED_MAX + 1`` is ``SEED_MIN``)."""
    return (seed + by - SEED_MIN) % 2**64 + SEED_MIN


@dataclass(frozen=True)
class SamplingParams:
    """Sampling parameters of one request, as in the OpenAI and vLLM APIs; ``None`` leaves
    the engine's default. ``extra`` goes to the upstream unchanged (for example
    ``chat_template_kwargs`` or ``repetition_penalty``)."""

    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    max_tokens: int | None = None
    stop: tuple[str, ...] | None = None
    seed: int | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)

    def from_sample(self, index: int) -> SamplingParams:
        """These params for a request whose first sample is a question's ``index``-th: a
        seeded question's requests carry ``seed + index``, and engines give a request's
        ``i``-th sample ``seed + i``, so no two samples of the question share a seed (both
        wrap around within the 64-bit seeds, :func:`shift_seed`)."""
        if self.seed is None or index == 0:
            return self
        return replace(self, seed=shift_seed(self.seed, index))


@dataclass(frozen=True)
class GenerateRequest:
    """``n`` samples for one prompt: exactly one of ``prompt`` (completions mode: text, or
    token ids as vLLM takes them) and ``messages`` (chat mode) is set. ``question_id``
    serves replica affinity and replay lookup; ``model`` and ``timeout`` (seconds for the
    whole call) None: the engine's default. ``confidence``: read each sample's confidence
    from its tokens' logprobs, as the spec says (None: no logprobs are asked for).
    ``cut_below``: a sample whose window confidence (``confidence.window`` tokens) falls
    below this is cut there, its upstream request closed, and handed over with finish
    reason :data:`~blendserve.core.traces.LOW_CONFIDENCE` and the tokens it had (None:
    never; needs ``confidence``). Engines that cannot read a trace as it streams ignore it.
    """

    prompt: str | Sequence[int] | None = None
    messages: Sequence[Mapping[str, Any]] | None = None
    n: int = 1
    params: SamplingParams = field(default_factory=SamplingParams)
    model: str | None = None
    question_id: str | None = None
    timeout: float | None = None
    confidence: ConfidenceSpec | None = None
    cut_below: float | None = None

    def __post_init__(self) -> None:
        if self.cut_below is not None and self.confidence is None:
            raise ValueError("cut_below needs confidence: a trace is cut on what it reads")
        if (self.prompt is None) == (self.messages is None):
            raise ValueError("a request needs exactly one of prompt and messages")
        if self.n < 1:
            raise ValueError(f"n must be at least 1, got {self.n}")


@dataclass(frozen=True)
class Sample:
    """One generated completion, its ``finish_reason`` as reported upstream.

    With a reasoning parser upstream, ``text`` is its ``content`` (the final answer alone)
    and ``reasoning`` the thought (vLLM's ``reasoning`` or ``reasoning_content``; None: not
    split out, though ``text`` may hold one, see :meth:`thought`). ``prompt_tokens`` are
    its request's; ``completion_tokens`` include the thought's, which ``reasoning_tokens``
    counts where the upstream does. ``upstream`` names the URL or engine that served it.
    ``stop_reason`` is the stop string or token id that ended it, where the upstream says
    (vLLM; None at the end-of-sequence token); ``confidence`` is read from its logprobs
    where its request asked for them (:mod:`blendserve.core.signals`).
    """

    text: str
    finish_reason: str | None
    prompt_tokens: int
    completion_tokens: int
    upstream: str
    reasoning: str | None = None
    reasoning_tokens: int | None = None
    stop_reason: str | None = None
    confidence: Confidence | None = None

    def thought(self, tags: ReasoningTags = DEFAULT_REASONING_TAGS) -> Thought:
        """This sample as a thought and a final answer, however the model and upstream wrote it.

        Split upstream: ``text`` is the answer, and a thought with no answer
        after it (the content null or blank) was cut. Else ``text`` is read
        for ``tags`` and harmony channels (:func:`read_thought`).
        """
        if self.reasoning is not None:
            return Thought(self.text, self.reasoning, cut=not self.text.strip())
        return read_thought(self.text, tags)


@dataclass(frozen=True)
class EngineHealth:
    """Whether an engine can serve (at least one upstream can take requests), each upstream's
    health by name, and why it cannot where it knows (``detail``: a dead server process)."""

    healthy: bool
    upstreams: Mapping[str, bool] = field(default_factory=dict)
    detail: str | None = None


@dataclass(frozen=True)
class EngineLoad:
    """How full an engine is: the sequences it runs at once (``capacity``, None: unknown),
    and those asked of it now, running or queued behind them (``waiting``)."""

    capacity: int | None
    running: int = 0
    waiting: int = 0

    @property
    def free(self) -> int:
        """Sequences the engine could start now without queueing (0 when unknown)."""
        if self.capacity is None:
            return 0
        return max(0, self.capacity - self.running - self.waiting)


@dataclass(frozen=True)
class UpstreamReply:
    """An upstream's reply to a forwarded request (its HTTP status and ``Content-Type``),
    passed on as it arrives: closing ``body`` (or reading it to the end) releases the
    upstream request."""

    status: int
    content_type: str
    body: AsyncIterator[bytes]


class Engine(ABC):
    """Produces samples. Cancelling ``generate`` cancels the work upstream.

    Implementations must be safe to call concurrently from one event loop,
    never count a sample twice, and raise only :class:`~blendserve.errors.EngineError`
    subclasses for upstream failures.
    """

    #: Short name for logs and metrics.
    name: str = ""
    #: Where the engine reports its upstreams' samples and health; jobs and
    #: pools built on the engine report there too unless given their own.
    sink: Stats = NO_STATS
    #: Sequences the engine runs at once, as configured (None: unknown, and
    #: jobs decide sample by sample).
    capacity: int | None = None
    #: What a decode step costs by width, as far as known (the service sets it; see
    #: :mod:`blendserve.engines.engine_cost`); engines that can measure it feed it.
    cost: EngineCost | None = None
    #: Whether :meth:`stream` hands each sample over as it ends (False: a request's
    #: samples come together, once its last ends). Jobs plan fewer, larger waves only
    #: where it does (see :mod:`blendserve.scheduler.job`).
    delivers_each: bool = False
    _sequences_in_flight = 0  # written by counted_stream alone

    @property
    def sequences_in_flight(self) -> int:
        """Sequences this process has asked of the engine and not yet received: every job and
        pool asks through :meth:`counted_stream`, which keeps it, so each sees the others'."""
        return self._sequences_in_flight

    def load(self) -> EngineLoad:
        """How full the engine is now; by default, what this process has sent it."""
        return EngineLoad(self.capacity, self.sequences_in_flight)

    def report_to(self, sink: Stats) -> None:
        """Reports to ``sink`` from now on, starting with the engine's upstreams and health."""
        self.sink = sink
        if self.cost is not None:
            self.cost.report_to(sink)

    @abstractmethod
    async def generate(self, request: GenerateRequest) -> list[Sample]:
        """Returns exactly ``request.n`` samples, or raises an ``EngineError``.

        Raises:
            EngineTimeout: the deadline passed.
            EngineUnavailable: no upstream could serve.
            EngineProtocolError: an upstream answered unusably.
        """

    async def stream(self, request: GenerateRequest) -> AsyncGenerator[Sample, None]:
        """The request's samples, each handed over as it ends (at most ``request.n``), so that
        votes count while the rest run; closing the iterator early cancels the samples still
        running (a settled question's stragglers). By default every sample comes at once,
        when :meth:`generate` returns; raises as it does."""
        for sample in await self.generate(request):
            yield sample

    @final
    async def counted_stream(self, request: GenerateRequest) -> AsyncGenerator[Sample, None]:
        """:meth:`stream`, its samples counted in :attr:`sequences_in_flight` while out: the
        request's ``n`` once it starts, one less as each is handed over, and none once it
        ends, however it ends. Not overridden: an engine's :meth:`stream` says how samples
        come, this what is out."""
        left = request.n
        self._sequences_in_flight += left
        try:
            stream = self.stream(request)
            async with contextlib.aclosing(stream):
                async for sample in stream:
                    if left:  # an engine that sends more than asked counts none below 0
                        left -= 1
                        self._sequences_in_flight -= 1
                    yield sample
        finally:
            self._sequences_in_flight -= left

    @abstractmethod
    async def health(self) -> EngineHealth:
        """Current health, without waiting on a slow upstream for long."""

    def down(self) -> EngineDown | None:
        """Why the engine cannot serve at all now, known without asking it (None: it may): an
        engine that owns its server process says so once it died, so that requests fail at
        once with the cause instead of retrying."""
        return None

    async def models(self) -> list[str]:
        """Model names the engine serves."""
        return []

    async def aclose(self) -> None:
        """Releases connections, processes and engine state."""
