"""A continuously batching engine, modelled step by step on a decode-step cost profile.

Every running sequence gains a token a step, a step lasting what the
:class:`~blendserve.engines.step_cost.StepCost` says for its width and mean
context; sequences join first come first served as slots free, and a
sequence's first step also computes its prompt, less its full blocks of
:data:`BLOCK` tokens in the prefix cache (docs/engines.md, "A GPU's batch, modelled").
Time is the event loop's: real seconds in ``serve``, the simulator's virtual ones.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import math
from collections import deque
from collections.abc import AsyncGenerator
from dataclasses import dataclass, field

from blendserve.engines.base import EngineLoad
from blendserve.engines.step_cost import StepCost
from blendserve.util.byte_lru import ByteLRU

__all__ = ["BLOCK", "ContinuousBatch", "first_step_ms"]

#: Tokens of a prefix-cache block (vLLM's default block size).
BLOCK = 16
_DONE = 1e-6  # tokens left below which a sequence has ended
_CACHE_BYTES = 16 * 1024 * 1024  # prompts remembered as cached, by their keys' size


@dataclass(eq=False)
class _Sequence:
    length: float  # tokens to decode
    prompt: int  # tokens of its prompt
    ended: asyncio.Future[None] = field(repr=False)
    prefix: str | None = None  # the prompt, as the prefix cache knows it (None: never cached)
    order: int = 0  # when it joined the batch's running sequences, first to last
    start: float = 0.0  # the batch's decoded tokens when it joined
    prefill: float = 0.0  # prompt tokens its first step computes (0: past its first step)
    gone: bool = False  # left the batch before it ended


def _computed(prompt: int, cached: bool) -> float:
    """Tokens a sequence's first step computes of its prompt: those past the cached full
    blocks where its prompt is cached, and always at least one."""
    return float(max(1, prompt % BLOCK if cached else prompt))


def first_step_ms(cost: StepCost, prompt_tokens: int, n: int) -> float:
    """Milliseconds of the first step of a request for ``n`` samples of an uncached prompt:
    the first computes it whole, the others past its full blocks."""
    tokens = _computed(prompt_tokens, False) + (n - 1) * _computed(prompt_tokens, True)
    return cost.step_ms(n, prompt_tokens, tokens)


class ContinuousBatch:
    """Sequences decoded together, step by step, joining as slots free.

    Every running sequence gains the same tokens, so the batch counts them once
    (``_decoded``) and keeps ends in heaps: a change of the batch costs the log
    of its width, which keeps a wide batch in step with real time.

    Args:
        cost: the decode-step cost.
        capacity: sequences decoded at once (None: unlimited).
        scale: multiplies every step's time (below 1: a faster engine).
    """

    def __init__(self, cost: StepCost, capacity: int | None = None, scale: float = 1.0) -> None:
        self.cost = cost
        self.capacity = capacity
        self.scale = scale
        self._running: set[_Sequence] = set()  # never iterated: ends come off the heap in order
        self._waiting: deque[_Sequence] = deque()  # with those gone, skipped when admitted
        self._num_waiting = 0
        self._decoded = 0.0  # tokens every running sequence decoded since the batch was empty
        self._joined = 0
        self._ends: list[tuple[float, int, _Sequence]] = []  # (decoded at its end, order, it)
        self._firsts: list[tuple[float, int, _Sequence]] = []  # the same, of its first step
        self._ctx_less_decoded = 0.0  # the running sequences' context, less _decoded each
        self._prefill_extra = 0.0  # tokens their first steps compute beyond one a sequence
        self._cached: ByteLRU[str, bool] = ByteLRU(_CACHE_BYTES)  # prompts, blocks cached
        self._changed = asyncio.Event()
        self._driver: asyncio.Task[None] | None = None

    def step_s(self) -> float:
        """Seconds of the next step of the sequences running now."""
        width = len(self._running)
        ctx = self._ctx_less_decoded / width + self._decoded if width else 0.0
        tokens = width + self._prefill_extra
        return self.cost.step_ms(width, ctx, tokens) * self.scale / 1000.0

    def load(self) -> EngineLoad:
        """The capacity, the sequences running and those waiting for a slot."""
        return EngineLoad(self.capacity, len(self._running), self._num_waiting)

    async def ends(
        self, prompt_tokens: int, lengths: list[int], prefix: str | None = None
    ) -> AsyncGenerator[int, None]:
        """Decodes one sequence of each of ``lengths`` tokens after a prompt of
        ``prompt_tokens`` (cached as ``prefix``), yielding each one's index as it ends.

        Closed or cancelled early, the sequences still running or waiting leave
        the batch at once.
        """
        loop = asyncio.get_running_loop()
        sequences = [
            _Sequence(float(n), prompt_tokens, loop.create_future(), prefix) for n in lengths
        ]
        index = {sequence.ended: i for i, sequence in enumerate(sequences)}
        self._waiting.extend(sequences)
        self._num_waiting += len(sequences)
        self._wake()
        pending: set[asyncio.Future[None]] = set(index)
        try:
            while pending:
                done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                for i in sorted(index[future] for future in done):
                    yield i
        finally:
            if pending:
                self._leave([s for s in sequences if not s.ended.done()])

    def _leave(self, sequences: list[_Sequence]) -> None:
        """Takes ``sequences`` out of the batch, running or waiting, and frees their slots."""
        for sequence in sequences:
            if sequence.gone:
                continue
            sequence.gone = True
            if sequence in self._running:
                self._drop(sequence)
            else:
                self._num_waiting -= 1
            sequence.ended.cancel()
        self._wake()

    def _drop(self, sequence: _Sequence) -> None:
        """Takes a running sequence's part out of the batch's sums (its heap entries are
        skipped when they come up)."""
        self._running.remove(sequence)
        self._ctx_less_decoded -= sequence.prompt - sequence.start
        if sequence.prefill:
            self._prefill_extra -= sequence.prefill - 1.0

    def _wake(self) -> None:
        """Tells the driver that the batch changed, starting it on this loop if none runs."""
        self._changed.set()
        if self._driver is None or self._driver.done():
            self._changed = asyncio.Event()
            self._driver = asyncio.get_running_loop().create_task(self._drive())

    def _admit(self) -> None:
        if not self._running:  # a fresh count: it stays small, and so exact
            self._decoded = self._ctx_less_decoded = self._prefill_extra = 0.0
            self._ends.clear()
            self._firsts.clear()
        while self._num_waiting and (self.capacity is None or len(self._running) < self.capacity):
            sequence = self._waiting.popleft()
            if sequence.gone:
                continue
            self._num_waiting -= 1
            cached = False
            if sequence.prefix is not None:
                cached = sequence.prefix in self._cached
                self._cached.put(sequence.prefix, True)
            sequence.prefill = _computed(sequence.prompt, cached)
            sequence.start = self._decoded
            sequence.order = self._joined
            self._joined += 1
            self._running.add(sequence)
            self._ctx_less_decoded += sequence.prompt - sequence.start
            self._prefill_extra += sequence.prefill - 1.0
            entry = (sequence.start + sequence.length, sequence.order, sequence)
            heapq.heappush(self._ends, entry)
            heapq.heappush(self._firsts, (sequence.start + 1.0, sequence.order, sequence))

    def _next(self, heap: list[tuple[float, int, _Sequence]]) -> float:
        """The first mark of ``heap`` of a sequence still running (inf: none)."""
        while heap and heap[0][2] not in self._running:
            heapq.heappop(heap)
        return heap[0][0] if heap else math.inf

    async def _drive(self) -> None:
        """Decodes until nothing runs or waits: up to the next end, or a change of the batch."""
        loop = asyncio.get_running_loop()
        while True:
            self._admit()
            if not self._running:
                return
            step = max(self.step_s(), 1e-12)
            mark = min(self._next(self._ends), self._next(self._firsts))
            until_end = step * (mark - self._decoded)
            self._changed.clear()
            started = loop.time()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), until_end)
            elapsed = loop.time() - started
            self._decoded += min(elapsed, until_end) / step
            done = self._decoded + _DONE
            while self._next(self._firsts) <= done:
                sequence = heapq.heappop(self._firsts)[2]
                self._prefill_extra -= sequence.prefill - 1.0
                sequence.prefill = 0.0
            ended: list[tuple[int, _Sequence]] = []
            while self._next(self._ends) <= done:
                _, order, sequence = heapq.heappop(self._ends)
                self._drop(sequence)
                ended.append((order, sequence))
            for _, sequence in sorted(ended, key=lambda pair: pair[0]):
                if not sequence.ended.done():
                    sequence.ended.set_result(None)
