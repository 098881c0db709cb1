"""Fixtures of the engine tests: fake OpenAI-compatible upstreams on 127.0.0.1."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
from blendserve.testing.fake_openai import FakeServer, FakeState


@pytest.fixture
def fakes() -> Iterator[Callable[..., list[FakeServer]]]:
    """Starts fake upstreams: ``fakes(count, **knobs)``; all are stopped afterwards."""
    started: list[FakeServer] = []

    def start(count: int, **knobs: Any) -> list[FakeServer]:
        servers = [
            FakeServer(FakeState(name=f"r{len(started) + i}", **knobs)) for i in range(count)
        ]
        for server in servers:
            started.append(server.start())
        return servers

    yield start
    for server in started:
        server.signal_stop()
    for server in started:
        server.join()
