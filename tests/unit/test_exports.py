"""Each layer's ``__all__`` lists exactly its public names, and every one imports."""

import importlib

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
    import sys

    for name in [m for m in sys.modules if m.startswith("blendserve")]:
        del sys.modules[name]
    importlib.import_module("blendserve.core")
    loaded = {m for m in sys.modules if m.startswith("blendserve")}
    assert all(m.startswith(("blendserve.core", "blendserve")) for m in loaded)
    assert not any(m.startswith(("blendserve.sim", "blendserve.service")) for m in loaded)
    for banned in ("fastapi", "httpx", "uvicorn", "asyncio"):
        assert banned not in sys.modules or banned == "asyncio", banned
