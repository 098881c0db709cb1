"""A fake in-process engine for scheduler tests: scripted answers, failures and stalls.

It is a test double, not a model: each question answers from its own list of
(answer, weight) pairs with a seeded RNG, and it records every request.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any

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
