"""An engine's configuration objects: their defaults, and what they refuse."""

from __future__ import annotations

import pytest
from blendserve.engines import Health, Limits, RetryPolicy, Timeouts
from blendserve.engines.openai import OpenAIEngine


def test_the_defaults_are_the_engines() -> None:
    assert Timeouts() == Timeouts(call=600.0, connect=10.0, stall=None)
    assert Limits() == Limits(connections=256, response_bytes=64 << 20)
    assert Health() == Health(failure_threshold=3, probe_interval=2.0, affinity_slack=4)
    assert RetryPolicy().max_retries == 3


@pytest.mark.parametrize(
    "make",
    [
        lambda: Timeouts(call=0),
        lambda: Timeouts(connect=-1),
        lambda: Timeouts(stall=0),
        lambda: Limits(connections=0),
        lambda: Limits(response_bytes=0),
        lambda: Health(probe_interval=0),
        lambda: RetryPolicy(max_retries=-1),
        lambda: OpenAIEngine(["http://h"], timeouts=Timeouts(stall=1.0)),  # stall needs stream
    ],
)
def test_bad_settings_are_refused_when_made(make: object) -> None:
    with pytest.raises(ValueError):
        make()  # type: ignore[operator]
