"""A fake in-process engine for scheduler tests: scripted answers, failures and stalls.

It is a test double, not a model: each question answers from its own list of
(answer, weight) pairs with a seeded RNG, and it records every request.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any

from blendserve.core.signals import Confidence
from blendserve.engines.base import Engine, EngineHealth, GenerateRequest, Sample
from blendserve.engines.replay import ReplayEngine
from blendserve.errors import EngineUnavailable


class FakeEngine(Engine):
    """Answers ``question_id`` from ``distributions``; ``fail_next`` requests raise."""

    name = "fake"

    def __init__(
        self,
        distributions: Mapping[str, Sequence[tuple[str, float]]],
        *,
        seed: int = 0,
        fail_next: int = 0,
        stall: bool = False,
        latency: float = 0.0,
    ) -> None:
        self.distributions = distributions
        self.rng = random.Random(seed)
        self.fail_next = fail_next
        self.stall = stall
        self.latency = latency  # seconds of simulated generation per request
        self.requests: list[GenerateRequest] = []
        self.served: list[tuple[str, str]] = []  # (question id, answer) per sample
        self.in_flight = 0
        self.cancelled = 0
        self.started = asyncio.Event()

    async def generate(self, request: GenerateRequest) -> list[Sample]:
        self.requests.append(request)
        self.in_flight += 1
        self.started.set()
        try:
            if self.stall:
                await asyncio.Event().wait()
            await asyncio.sleep(self.latency)  # a real engine always yields to the loop
            if self.fail_next > 0:
                self.fail_next -= 1
                raise EngineUnavailable("injected failure")
            assert request.question_id is not None
            answers, weights = zip(*self.distributions[request.question_id], strict=True)
            samples = []
            for _ in range(request.n):
                answer = self.rng.choices(answers, weights)[0]
                self.served.append((request.question_id, answer))
                finish = "length" if answer == "cut" else "stop"
                samples.append(Sample(f"so it is {answer}", finish, 5, 4, "fake"))
            return samples
        except asyncio.CancelledError:
            self.cancelled += 1
            raise
        finally:
            self.in_flight -= 1

    async def health(self) -> EngineHealth:
        return EngineHealth(True, {"fake": True})


async def last_word(text: str) -> tuple[str | None, str | None]:
    """A keyer for tests: the last word is the answer and its key."""
    word = text.rsplit(" ", 1)[-1]
    return (word, word) if word != "none" else (None, None)


class SeedRecordingEngine(ReplayEngine):
    """Replay engine that records each sample's seed (``seed + i`` for the i-th of a request)."""

    def __init__(self, records: list[dict[str, Any]]) -> None:
        super().__init__(records)
        self.seeds: dict[str, list[int]] = {}

    async def replay_stream(self, request: GenerateRequest, kind: str) -> AsyncIterator[Sample]:
        assert request.params.seed is not None and request.question_id is not None
        seeds = self.seeds.setdefault(request.question_id, [])
        seeds += [request.params.seed + i for i in range(request.n)]
        async for sample in super().replay_stream(request, kind):
            yield sample


#: A scripted sample of :class:`FakeSignalEngine`: its answer (None: it gives none), its
#: completion tokens and its mean token confidence.
ScriptedSample = tuple[str | None, int, float]


class FakeSignalEngine(Engine):
    """A fake engine whose samples carry lengths, and confidence where a request asks for it.

    Each question (looked up by id, else prompt, else its last message's content) serves
    its ``scripts`` in turn, cycling; the text ``so it is <answer>`` (``none``: no answer).
    After ``hang_after[question]`` samples its requests hang until cancelled. Every
    request and every sample served are kept, the samples as ``(question, answer, tokens,
    confidence)``; ``served_one`` is set at each.
    """

    name = "fake-signals"

    def __init__(
        self,
        scripts: Mapping[str, Sequence[ScriptedSample]],
        *,
        hang_after: Mapping[str, int] | None = None,
    ) -> None:
        self.scripts = scripts
        self.hang_after = dict(hang_after or {})
        self.requests: list[GenerateRequest] = []
        self.served: list[tuple[str, str | None, int, Confidence | None]] = []
        self.cancelled = 0
        self._next: dict[str, int] = {}

    def _question(self, request: GenerateRequest) -> str:
        keys = [request.question_id, request.prompt]
        if request.messages:
            keys.append(request.messages[-1].get("content"))
        for key in keys:
            if isinstance(key, str) and key in self.scripts:
                return key
        raise EngineUnavailable(f"fake-signals has no script for {keys}")

    async def generate(self, request: GenerateRequest) -> list[Sample]:
        self.requests.append(request)
        question = self._question(request)
        try:
            await asyncio.sleep(0)  # a real engine always yields to the loop
            samples = []
            for _ in range(request.n):
                done = self._next.get(question, 0)
                if done >= self.hang_after.get(question, done + 1):
                    await asyncio.Event().wait()
                self._next[question] = done + 1
                answer, tokens, mean = self.scripts[question][done % len(self.scripts[question])]
                confidence = None
                if request.confidence is not None:
                    block = max(1, tokens // 2)
                    confidence = Confidence(
                        mean, mean - 0.5, mean + 0.25, tokens, request.confidence.window, block,
                        (mean - 0.5, mean + 0.5),
                    )  # fmt: skip
                self.served.append((question, answer, tokens, confidence))
                text = f"so it is {answer if answer is not None else 'none'}"
                samples.append(Sample(text, "stop", 7, tokens, self.name, confidence=confidence))
            return samples
        except asyncio.CancelledError:
            self.cancelled += 1
            raise

    async def health(self) -> EngineHealth:
        return EngineHealth(True, {self.name: True})
