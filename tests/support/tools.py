"""Outside tools some tests run (Debian's Prometheus, docker-compose)."""

import os
import shutil

import pytest

#: Set (to 1) where every outside tool must be there: CI installs them, and a missing one fails.
REQUIRED = "BLENDSERVE_REQUIRE_TOOLS"


def require(name: str, hint: str) -> str:
    """The path of tool ``name``; without it the test skips with ``hint`` (fails under CI)."""
    path = shutil.which(name)
    if path is None:
        message = f"{name} not found: {hint}"
        if os.environ.get(REQUIRED) == "1":
            pytest.fail(message)
        pytest.skip(message)
    return path
