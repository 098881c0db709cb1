import asyncio
import hashlib
import importlib
from pathlib import Path

import pytest
from blendserve.engines.embedded import (
    MODELS,
    EmbeddedEngine,
    EmbeddedLlamaServer,
    ModelSpec,
    ensure_model,
)
from blendserve.engines.openai import OpenAIEngine
from blendserve.errors import EngineUnavailable


def _fake_parts(root: Path, monkeypatch: pytest.MonkeyPatch, prefix: str) -> bytes:
    content = b""
    for i in (1, 2):
        data = root / f"{prefix}{i}" / "data"
        data.mkdir(parents=True)
        (data.parent / "__init__.py").write_text("")
        piece = f"piece {i} ".encode() * 1000
        (data / f"part{i:02d}.bin").write_bytes(piece)
        content += piece
    monkeypatch.syspath_prepend(str(root))
    importlib.invalidate_caches()
    return content


def _spec(prefix: str, sha256: str) -> dict[str, ModelSpec]:
    parts = tuple((f"{prefix}{i}", f"data/part{i:02d}.bin") for i in (1, 2))
    return {"tiny": ModelSpec("tiny.gguf", parts, sha256, "pip install tiny-model")}


def test_parts_are_joined_in_order_and_verified_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    content = _fake_parts(tmp_path / "site", monkeypatch, "tinyparts_ok")
    models = _spec("tinyparts_ok", hashlib.sha256(content).hexdigest())
    path = ensure_model("tiny", tmp_path / "cache", models)
    assert path.read_bytes() == content
    # The verified file is reused without reading the parts again.
    (tmp_path / "site" / "tinyparts_ok1" / "data" / "part01.bin").unlink()
    assert ensure_model("tiny", tmp_path / "cache", models) == path


def test_checksum_mismatch_is_a_clear_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _fake_parts(tmp_path / "site", monkeypatch, "tinyparts_bad")
    with pytest.raises(EngineUnavailable, match=r"failed its checksum.*pip install tiny-model"):
        ensure_model("tiny", tmp_path / "cache", _spec("tinyparts_bad", "0" * 64))
    assert not list((tmp_path / "cache").iterdir())


def test_missing_package_names_what_to_install(tmp_path: Path) -> None:
    with pytest.raises(EngineUnavailable, match=r"not installed.*pip install tiny-model"):
        ensure_model("tiny", tmp_path, _spec("no_such_package_part", "0" * 64))


def test_unknown_model(tmp_path: Path) -> None:
    with pytest.raises(EngineUnavailable, match="unknown embedded model"):
        ensure_model("giant", tmp_path)
    assert "qwen2.5-coder-0.5b" in MODELS


def test_the_embedded_engine_lists_its_model_by_name() -> None:
    async def listed() -> list[str]:
        server = EmbeddedLlamaServer(Path("model.gguf"), model_name="qwen2.5-coder-0.5b")
        inner = OpenAIEngine(["http://127.0.0.1:9/v1"])  # never asked: the name is known
        try:
            return await EmbeddedEngine(server, inner).models()
        finally:
            await inner.aclose()

    assert asyncio.run(listed()) == ["qwen2.5-coder-0.5b"]


def test_the_embedded_engine_runs_as_many_sequences_at_once_as_its_server_has_slots() -> None:
    async def capacities() -> list[int | None]:
        inner = OpenAIEngine(["http://127.0.0.1:9/v1"])  # never asked: the slots are known
        try:
            llama = EmbeddedEngine(EmbeddedLlamaServer(Path("model.gguf")), inner)
            seen = [llama.load().capacity, llama.capacity]
            llama.capacity = 6  # --engine-capacity says otherwise: it is what jobs plan by
            seen.append(llama.load().capacity)
            stand_in = EmbeddedEngine(EmbeddedLlamaServer(Path("model.gguf"), slots=4), inner)
            return [*seen, stand_in.load().capacity]
        finally:
            await inner.aclose()

    # llama-cpp-python's server runs one completion at a time; the engine's own capacity
    # stays unset (calibrate measures this server past its one slot).
    assert asyncio.run(capacities()) == [1, None, 6, 4]
    with pytest.raises(ValueError, match="slots must be at least 1"):
        EmbeddedLlamaServer(Path("model.gguf"), slots=0)


@pytest.mark.parametrize(("cores", "threads"), [(1, 1), (2, 1), (3, 1), (8, 4)])
def test_llama_cpp_leaves_half_the_cores_to_the_rest(
    monkeypatch: pytest.MonkeyPatch, cores: int, threads: int
) -> None:
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: set(range(cores)), raising=False)
    command = list(EmbeddedLlamaServer(Path("model.gguf")).command(8000))
    assert command[command.index("--n_threads") + 1] == str(threads)
    explicit = list(EmbeddedLlamaServer(Path("model.gguf"), n_threads=3).command(8000))
    assert explicit[explicit.index("--n_threads") + 1] == "3"
