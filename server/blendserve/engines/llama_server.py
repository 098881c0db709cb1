"""The embedded llama.cpp server process: started, watched, and restarted when it dies.

A child's exit is seen at once (a pidfd on Linux, else a waiting thread): then
:meth:`EmbeddedLlamaServer.down` says what died and why, and the server is
started again with backoff (docs/engines.md, "When the server dies").
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.metadata
import importlib.util
import logging
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import httpx2

from blendserve.errors import EngineDown, EngineUnavailable

__all__ = ["REBUILD_HINT", "EmbeddedLlamaServer", "ServerExit", "default_threads", "ggml_build"]

_log = logging.getLogger(__name__)

#: What to do when llama.cpp was built for a CPU other than the host's.
REBUILD_HINT = (
    "llama.cpp was built for instructions this CPU does not run (a build tuned to "
    "another CPU, or one that advertises AMX or AVX-512 it does not enable): rebuild it "
    "portably with `pip cache remove llama_cpp_python && CMAKE_ARGS=-DGGML_NATIVE=OFF "
    "pip install --force-reinstall --no-deps -c constraints.txt llama-cpp-python` "
    "(docs/engines.md), or run with --upstream URL"
)
_CAUSES = {
    signal.SIGILL: REBUILD_HINT,
    signal.SIGKILL: "killed from outside, often by the kernel's out-of-memory killer",
    signal.SIGSEGV: "a crash in llama.cpp; its log says more",
}
_TAIL_LINES = 6  # lines of the child's log a message quotes
_MAX_BACKOFF_S = 60.0


@dataclass(frozen=True)
class ServerExit:
    """How a server process ended.

    Attributes:
        returncode: its exit status (negative: the signal that ended it).
        log_tail: the last lines it wrote.
        at: when it was seen to end (``time.monotonic()``).
    """

    returncode: int
    log_tail: str
    at: float

    @property
    def how(self) -> str:
        """``killed by SIGILL (Illegal instruction)`` or ``exited with code 1``."""
        if self.returncode < 0:
            with contextlib.suppress(ValueError):
                number = signal.Signals(-self.returncode)
                return f"killed by {number.name} ({signal.strsignal(number)})"
            return f"killed by signal {-self.returncode}"
        return f"exited with code {self.returncode}"

    def describe(self) -> str:
        """What ended, why where it is known, and the last lines of its log."""
        text = f"the embedded llama.cpp server was {self.how}"
        with contextlib.suppress(ValueError):
            cause = _CAUSES.get(signal.Signals(-self.returncode))
            if cause:
                text += f": {cause}"
        lines = self.log_tail.strip().splitlines()[-_TAIL_LINES:]
        if lines:
            text += ". Its last lines: " + " | ".join(line.strip() for line in lines)
        return text


_SETTING = re.compile(r'^set\((GGML_[A-Z0-9_]+) "([^"]*)"\)$', re.MULTILINE)


def ggml_build(distribution: str = "llama-cpp-python") -> dict[str, str]:
    """The ``GGML_*`` options the installed llama.cpp was built with ({} if unknown).

    Read from the ``ggml-config.cmake`` the wheel installs (``GGML_NATIVE``:
    ``ON`` for a build tuned to the machine that built it).
    """
    try:
        files = importlib.metadata.files(distribution) or []
    except importlib.metadata.PackageNotFoundError:
        return {}
    for file in files:
        if file.name == "ggml-config.cmake":
            text = Path(str(file.locate())).read_text(encoding="utf-8", errors="replace")
            return dict(_SETTING.findall(text))
    return {}


def default_threads() -> int:
    """Half the cores this process may run on, at least one: llama.cpp's threads.

    llama.cpp's threads wait on each other at every step: with one on each core,
    anything else that runs (the service itself, a test, a build) stalls them all.
    """
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # no affinity outside Linux
        cores = os.cpu_count() or 1
    return max(1, cores // 2)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _pidfd(process: subprocess.Popen[bytes]) -> int | None:
    """A descriptor that turns readable when ``process`` ends (None: no pidfds, or reaped)."""
    try:
        return os.pidfd_open(process.pid)
    except (AttributeError, OSError):
        return None


async def _readable(fd: int) -> None:
    """Returns when ``fd`` is readable, then closes it."""
    loop = asyncio.get_running_loop()
    ready: asyncio.Future[None] = loop.create_future()

    def wake() -> None:
        if not ready.done():
            ready.set_result(None)

    loop.add_reader(fd, wake)
    try:
        await ready
    finally:
        loop.remove_reader(fd)
        os.close(fd)


async def _exit_of(process: subprocess.Popen[bytes]) -> int:
    """Waits for ``process`` to end (a pidfd; a thread where the OS has none) and reaps it."""
    pidfd = _pidfd(process)
    if pidfd is None:
        return await asyncio.to_thread(process.wait)
    await _readable(pidfd)
    return process.wait()


class EmbeddedLlamaServer:
    """A ``llama_cpp.server`` subprocess on a free loopback port, restarted when it dies.

    Args:
        model_path: the GGUF file.
        model_name: the name it serves the model under (None: the file's path).
        n_threads: CPU threads (default: :func:`default_threads`).
        startup_timeout: seconds to wait for the server to answer.
        command: the command line of a server on a port (default: llama.cpp's
            OpenAI server of the model); tests run stand-ins.
        max_restarts: restarts in a row before giving up; a server that ran
            ``stable_s`` seconds before it died starts a new row.
        restart_backoff: seconds before the first restart of a row, doubled
            for each further one (to a minute at most).
        slots: sequences the server runs at once. llama-cpp-python's server runs
            one: every completion holds its one model behind a lock, so requests
            sent together run one after another; a stand-in ``command`` may say
            otherwise.

    Attributes:
        launches: servers started so far (the port changes with each).
        exit: how the last server ended, while none runs in its place.
        gave_up: the restarts of a row all failed: the server stays down.
    """

    def __init__(
        self,
        model_path: Path,
        *,
        model_name: str | None = None,
        n_ctx: int = 4096,
        n_threads: int | None = None,
        startup_timeout: float = 120.0,
        command: Callable[[int], Sequence[str]] | None = None,
        max_restarts: int = 5,
        restart_backoff: float = 1.0,
        stable_s: float = 60.0,
        slots: int = 1,
    ) -> None:
        if slots < 1:
            raise ValueError(f"slots must be at least 1, got {slots}")
        self.model_path = model_path
        self.model_name = model_name
        self.n_ctx = n_ctx
        self.n_threads = n_threads or default_threads()
        self.startup_timeout = startup_timeout
        self.command = command or self._llama_command
        self.max_restarts = max_restarts
        self.restart_backoff = restart_backoff
        self.stable_s = stable_s
        self.slots = slots
        self.port = 0
        self.launches = 0
        self.exit: ServerExit | None = None
        self.gave_up = False
        self._restart_at: float | None = None  # when the next restart is due
        self._tries = 0  # restarts in the current row
        self._process: subprocess.Popen[bytes] | None = None
        self._log: tempfile._TemporaryFileWrapper[bytes] | None = None
        self._watcher: asyncio.Task[None] | None = None

    @property
    def base_url(self) -> str:
        """The server's OpenAI base URL."""
        return f"http://127.0.0.1:{self.port}/v1"

    @property
    def running(self) -> bool:
        """Whether the subprocess is alive."""
        return self._process is not None and self._process.poll() is None

    def _llama_command(self, port: int) -> list[str]:
        command = [
            sys.executable, "-m", "llama_cpp.server", "--model", str(self.model_path),
            "--host", "127.0.0.1", "--port", str(port), "--n_ctx", str(self.n_ctx),
            "--n_threads", str(self.n_threads),
            # Otherwise concurrent streams are cut after one chunk.
            "--interrupt_requests", "False",
        ]  # fmt: skip
        if self.model_name is not None:
            command += ["--model_alias", self.model_name]
        return command

    def _log_tail(self) -> str:
        if self._log is None:
            return ""
        self._log.flush()
        return Path(self._log.name).read_bytes()[-2000:].decode(errors="replace")

    def down(self) -> EngineDown | None:
        """Why the server cannot serve now (dead, restarting or given up), else None."""
        ended = self.exit
        process = self._process
        if ended is None and process is not None and process.poll() is not None:
            ended = ServerExit(process.returncode, self._log_tail(), time.monotonic())
        if ended is None:
            return None
        text = f"{ended.describe()}. It died {time.monotonic() - ended.at:.1f} s ago"
        if self.gave_up:
            return EngineDown(
                f"{text} and did not come back after {self._tries} restarts: fix the cause "
                "and restart blendserve"
            )
        if self._restart_at is None:
            return EngineDown(f"{text}; restarting it: retry in a few seconds")
        wait = max(0.0, self._restart_at - time.monotonic())
        return EngineDown(
            f"{text}; restart {self._tries} of {self.max_restarts} in {wait:.1f} s: retry then"
        )

    async def ended(self) -> None:
        """Returns when the running server ends (at once if none runs), on any event loop."""
        process = self._process
        if process is None or process.poll() is not None:
            return
        pidfd = _pidfd(process)
        if pidfd is not None:
            await _readable(pidfd)
            return
        while process.poll() is None:  # no pidfds: a poll, as cheap as a call here is long
            await asyncio.sleep(0.5)

    async def start(self) -> None:
        """Starts the server, waits until it lists its model, then watches it.

        Raises:
            EngineUnavailable: llama-cpp-python is missing, or the server exited
                or did not answer in time (with its last output).
        """
        if self.command == self._llama_command:
            if importlib.util.find_spec("llama_cpp") is None:
                raise EngineUnavailable(
                    "the embedded default needs llama-cpp-python's server: "
                    "CMAKE_ARGS=-DGGML_NATIVE=OFF pip install -c constraints.txt -e ./client "
                    "-e '.[embedded]' in a checkout (the README's first command), or run with "
                    "--upstream URL"
                )
            if ggml_build().get("GGML_NATIVE") == "ON":
                _log.warning(
                    "the installed llama.cpp was tuned to the CPU that built it: %s", REBUILD_HINT
                )
        await self._launch()
        self._watcher = asyncio.create_task(self._watch())

    async def _launch(self) -> None:
        """One server on a fresh port, answering; on failure none is left running."""
        self._close_log()
        self.port = _free_port()
        self.launches += 1
        # Kept open for the server's lifetime; closed (and deleted) with the next or by aclose().
        self._log = tempfile.NamedTemporaryFile(prefix="blendserve-llama-", suffix=".log")  # noqa: SIM115
        self._process = subprocess.Popen(
            list(self.command(self.port)),
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            await self._wait_ready()
        except BaseException:
            await self._stop()
            self._close_log()
            raise

    async def _wait_ready(self) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.startup_timeout
        async with httpx2.AsyncClient(timeout=2.0) as client:
            while True:
                if self._process is not None and self._process.poll() is not None:
                    ended = ServerExit(self._process.returncode, self._log_tail(), time.monotonic())
                    raise EngineUnavailable(f"{ended.describe()}\n{self._log_tail()}")
                with contextlib.suppress(httpx2.TransportError):
                    if (await client.get(f"{self.base_url}/models")).status_code == 200:
                        return
                if loop.time() > deadline:
                    raise EngineUnavailable(
                        f"llama.cpp server did not answer in {self.startup_timeout} s:\n"
                        f"{self._log_tail()}"
                    )
                await asyncio.sleep(0.2)

    async def _watch(self) -> None:
        """Sees each server end and starts the next, until a row of restarts fails."""
        started = time.monotonic()
        while self._process is not None:
            returncode = await _exit_of(self._process)
            self.exit = ServerExit(returncode, self._log_tail(), time.monotonic())
            if self.exit.at - started >= self.stable_s:
                self._tries = 0
            _log.error("%s", self.exit.describe())
            if not await self._restart():
                self.gave_up = True
                _log.error(
                    "the embedded llama.cpp server did not come back after %d restarts: "
                    "giving up; requests fail until blendserve is restarted",
                    self._tries,
                )
                return
            started = time.monotonic()
            self.exit = None
            _log.warning(
                "the embedded llama.cpp server is back on port %d (restart %d of %d)",
                self.port, self._tries, self.max_restarts,
            )  # fmt: skip

    async def _restart(self) -> bool:
        """Restarts with backoff until one start succeeds (True) or the row is used up."""
        while self._tries < self.max_restarts:
            self._tries += 1
            delay = min(_MAX_BACKOFF_S, self.restart_backoff * 2 ** (self._tries - 1))
            _log.warning(
                "restarting the embedded llama.cpp server in %.1f s (restart %d of %d)",
                delay, self._tries, self.max_restarts,
            )  # fmt: skip
            self._restart_at = time.monotonic() + delay
            await asyncio.sleep(delay)
            self._restart_at = None
            try:
                await self._launch()
            except EngineUnavailable as exc:
                _log.error("restart %d of %d failed: %s", self._tries, self.max_restarts, exc)
                continue
            return True
        return False

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

    async def _stop(self) -> None:
        """Stops the running server (SIGTERM, then SIGKILL after 10 s)."""
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

    def _close_log(self) -> None:
        if self._log is not None:
            self._log.close()
            self._log = None

    async def aclose(self) -> None:
        """Stops watching, then stops the server; safe to call twice."""
        watcher, self._watcher = self._watcher, None
        if watcher is not None:
            watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watcher
        await self._stop()
        self._close_log()
