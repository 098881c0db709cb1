"""The real ``blendserve serve`` command in a subprocess on a free loopback port."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO

import httpx

from blendserve.testing.waiting import wait_until


def free_port() -> int:
    """A loopback TCP port that was free a moment ago."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


#: How a child that lost its port to another process (another test worker) says so.
PORT_TAKEN = "address already in use"


class _PortTaken(Exception):
    """The port was free when chosen but taken before the child bound it."""


@contextmanager
def serve_command(
    *args: str, env: dict[str, str] | None = None, stderr: Path | None = None
) -> Iterator[tuple[str, subprocess.Popen[str]]]:
    """``blendserve serve --host 127.0.0.1 --port P *args``, yielded once ``/health`` answers 200.

    The child inherits this environment less its ``BLENDSERVE_*`` variables, plus ``env``.
    Its stderr is a pipe (read it with ``process.communicate()``), or the file ``stderr``
    when given (for a long-lived server whose pipe nobody reads). Startup fails at once,
    with that stderr, if the command exits (and is tried again on another port if that
    one was taken meanwhile). On leaving, a still-running process is killed.

    Yields:
        the base URL and the process.
    """
    for attempt in range(3):
        try:
            started = _start(args, env, stderr)
            break
        except _PortTaken:
            if attempt == 2:
                raise
    url, process, log = started
    try:
        yield url, process
    finally:
        if process.poll() is None:
            process.kill()
        process.communicate(timeout=30)
        if log:
            log.close()


def _start(
    args: tuple[str, ...], env: dict[str, str] | None, stderr: Path | None
) -> tuple[str, subprocess.Popen[str], IO[str] | None]:
    """Starts the command on a free port and waits until it is healthy."""
    port = free_port()
    command = [sys.executable, "-m", "blendserve.cli", "serve",
               "--host", "127.0.0.1", "--port", str(port), *args]  # fmt: skip
    inherited = {k: v for k, v in os.environ.items() if not k.startswith("BLENDSERVE_")}
    log = stderr.open("w") if stderr else None
    process = subprocess.Popen(
        command,
        env={**inherited, **(env or {})},
        stdout=subprocess.DEVNULL,
        stderr=log or subprocess.PIPE,
        text=True,
    )
    url = f"http://127.0.0.1:{port}"

    def healthy() -> bool:
        if process.poll() is not None:
            output = stderr.read_text() if stderr else process.communicate()[1]
            if PORT_TAKEN in output:
                raise _PortTaken(output)
            raise AssertionError(f"blendserve serve exited {process.returncode}:\n{output}")
        try:
            return httpx.get(f"{url}/health", timeout=1).status_code == 200
        except httpx.TransportError:
            return False

    try:
        wait_until(healthy, 60, "the service to start")
    except BaseException:
        if process.poll() is None:
            process.kill()
        process.communicate(timeout=30)
        if log:
            log.close()
        raise
    return url, process, log
