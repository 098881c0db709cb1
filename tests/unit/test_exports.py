"""Each layer's ``__all__`` lists exactly its public names, and every one imports."""

import importlib
import subprocess
import sys

import pytest


@pytest.mark.parametrize(
    "module",
    ["blendserve.core", "blendserve.core.policies", "blendserve.sim"],
)
def test_all_is_complete_and_importable(module: str) -> None:
    mod = importlib.import_module(module)
    public = {
        name
        for name, value in vars(mod).items()
        if not name.startswith("_") and not isinstance(value, type(importlib))
    }
    assert set(mod.__all__) == public
    for name in mod.__all__:
        assert getattr(mod, name) is not None


def test_core_imports_nothing_above_it() -> None:
    # A fresh interpreter, so that other tests' imports do not count.
    code = (
        "import sys, blendserve.core, blendserve.core.policies; "
        "print(' '.join(sorted(sys.modules)))"
    )
    loaded = subprocess.run(
        [sys.executable, "-c", code], check=True, capture_output=True, text=True
    ).stdout.split()
    ours = [m for m in loaded if m.startswith("blendserve.")]
    assert ours and all(m.startswith(("blendserve.core", "blendserve.errors")) for m in ours)
    for banned in ("fastapi", "httpx", "uvicorn", "starlette", "pydantic", "asyncio"):
        assert banned not in loaded, banned
