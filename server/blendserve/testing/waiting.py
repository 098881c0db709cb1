"""Poll a condition with a deadline: how tests wait for something to happen."""

from __future__ import annotations

import time
from collections.abc import Callable


def wait_until(
    condition: Callable[[], object], timeout: float, what: str = "the condition"
) -> float:
    """Polls ``condition`` until it is true and returns the seconds that took.

    A poll with a deadline, not a sleep for synchronisation: it returns as soon as
    ``condition()`` is truthy and raises ``AssertionError`` once ``timeout`` seconds
    have passed without that.
    """
    start = time.monotonic()
    while not condition():
        if time.monotonic() - start > timeout:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.005)
    return time.monotonic() - start
