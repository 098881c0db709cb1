"""Outside tools some tests run (Debian's Prometheus, docker-compose)."""

import os
import shutil
from typing import NoReturn

import pytest

#: Set (to 1) where every outside tool must be there: CI installs them, and a missing one fails.
REQUIRED = "BLENDSERVE_REQUIRE_TOOLS"


def missing(message: str) -> NoReturn:
    """An outside tool is missing: the test skips with ``message`` (its install hint), and
    fails where every tool must be there (CI)."""
    if os.environ.get(REQUIRED) == "1":
        pytest.fail(message)
    pytest.skip(message)


def require(name: str, hint: str) -> str:
    """The path of tool ``name``; without it the test skips with ``hint`` (fails under CI)."""
    path = shutil.which(name)
    if path is None:
        missing(f"{name} not found: {hint}")
    return path
