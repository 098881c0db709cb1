"""A continuously batching engine, modelled step by step on a decode-step cost profile.

Every running sequence gains one token a decode step, and a step of ``B``
sequences lasts what the :class:`~blendserve.engines.step_cost.StepCost` says
for ``B`` and their mean context. Sequences join, first come first served, as
soon as a slot frees (up to the capacity); each ends after its own number of
tokens, and a cancelled one frees its slot at once. Time is the event loop's:
real seconds (times ``scale``) in ``serve``, modelled seconds on the
simulator's virtual clock.

A sequence's first step also computes its prompt: the step's cost per
sequence is paid for each of its prompt tokens not in the prefix cache (a
step costs what it computes, as vLLM's scheduler budgets it in tokens), its
cost per token of context once. The cache holds a prompt's full blocks of
:data:`BLOCK` tokens once a sequence of it has joined, so the samples of one
question share them and a prompt shorter than a block is computed by every
sample, as in vLLM.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import AsyncGenerator
from dataclasses import dataclass, field

from blendserve._byte_lru import ByteLRU
from blendserve.engines.base import EngineLoad
from blendserve.engines.step_cost import StepCost

__all__ = ["BLOCK", "ContinuousBatch", "first_step_ms"]

#: Tokens of a prefix-cache block (vLLM's default block size).
BLOCK = 16
_DONE = 1e-6  # tokens left below which a sequence has ended
_CACHE_BYTES = 16 * 1024 * 1024  # prompts remembered as cached, by their keys' size


@dataclass(eq=False)
class _Sequence:
    left: float  # tokens still to decode
    ctx: float  # tokens of context: the prompt and those decoded so far
    ended: asyncio.Future[None] = field(repr=False)
    prefix: str | None = None  # the prompt, as the prefix cache knows it (None: never cached)
    prefill: float = 0.0  # prompt tokens its first step computes (0: past its first step)
    first_done: float = 0.0  # how much of its first step is done, from 0 to 1

    def tokens(self) -> float:
        """Tokens it computes in a step: its prompt's in its first step, else one."""
        return max(1.0, self.prefill)


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

    Args:
        cost: the decode-step cost.
        capacity: sequences decoded at once (None: unlimited).
        scale: multiplies every step's time (below 1: a faster engine).
    """

    def __init__(self, cost: StepCost, capacity: int | None = None, scale: float = 1.0) -> None:
        self.cost = cost
        self.capacity = capacity
        self.scale = scale
        self.running: list[_Sequence] = []
        self.waiting: deque[_Sequence] = deque()
        self._cached: ByteLRU[str, bool] = ByteLRU(_CACHE_BYTES)  # prompts, blocks cached
        self._changed = asyncio.Event()
        self._driver: asyncio.Task[None] | None = None

    def step_s(self) -> float:
        """Seconds of the next step of the sequences running now."""
        width = len(self.running)
        ctx = sum(s.ctx for s in self.running) / max(1, width)
        tokens = sum(s.tokens() for s in self.running)
        return self.cost.step_ms(width, ctx, tokens) * self.scale / 1000.0

    def load(self) -> EngineLoad:
        """The capacity, the sequences running and those waiting for a slot."""
        return EngineLoad(self.capacity, len(self.running), len(self.waiting))

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
            _Sequence(float(n), float(prompt_tokens), loop.create_future(), prefix) for n in lengths
        ]
        index = {sequence.ended: i for i, sequence in enumerate(sequences)}
        self.waiting.extend(sequences)
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
            if sequence in self.running:
                self.running.remove(sequence)
            elif sequence in self.waiting:
                self.waiting.remove(sequence)
            sequence.ended.cancel()
        self._wake()

    def _wake(self) -> None:
        """Tells the driver that the batch changed, starting it on this loop if none runs."""
        self._changed.set()
        if self._driver is None or self._driver.done():
            self._changed = asyncio.Event()
            self._driver = asyncio.get_running_loop().create_task(self._drive())

    def _admit(self) -> None:
        while self.waiting and (self.capacity is None or len(self.running) < self.capacity):
            sequence = self.waiting.popleft()
            prompt = int(sequence.ctx)  # its context is its prompt until it runs
            cached = False
            if sequence.prefix is not None:
                cached = sequence.prefix in self._cached
                self._cached.put(sequence.prefix, True)
            sequence.prefill = _computed(prompt, cached)
            self.running.append(sequence)

    async def _drive(self) -> None:
        """Decodes until nothing runs or waits: up to the next end, or a change of the batch."""
        loop = asyncio.get_running_loop()
        while True:
            self._admit()
            if not self.running:
                return
            step = max(self.step_s(), 1e-12)
            until_end = step * min(
                min(s.left, 1.0 - s.first_done) if s.prefill else s.left for s in self.running
            )
            self._changed.clear()
            started = loop.time()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), until_end)
            elapsed = loop.time() - started
            decoded = min(elapsed, until_end) / step
            for sequence in self.running:
                sequence.left -= decoded
                sequence.ctx += decoded
                if sequence.prefill:
                    sequence.first_done += decoded
                    if sequence.first_done >= 1.0 - _DONE:
                        sequence.prefill = 0.0
            ended = [s for s in self.running if s.left <= _DONE]
            self.running = [s for s in self.running if s.left > _DONE]
            for sequence in ended:
                if not sequence.ended.done():
                    sequence.ended.set_result(None)
