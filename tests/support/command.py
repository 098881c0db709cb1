"""The real ``blendserve serve`` command in a subprocess on a free loopback port."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

from tests.support.waiting import wait_until


def free_port() -> int:
    """A loopback TCP port that was free a moment ago."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextmanager
def serve_command(
    *args: str, env: dict[str, str] | None = None, stderr: Path | None = None
) -> Iterator[tuple[str, subprocess.Popen[str]]]:
    """``blendserve serve --host 127.0.0.1 --port P *args``, yielded once ``/health`` answers 200.

    The child inherits this environment less its ``BLENDSERVE_*`` variables, plus ``env``.
    Its stderr is a pipe (read it with ``process.communicate()``), or the file ``stderr``
    when given (for a long-lived server whose pipe nobody reads). Startup fails at once,
    with that stderr, if the command exits. On leaving, a still-running process is killed.

    Yields:
        the base URL and the process.
    """
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
            raise AssertionError(f"blendserve serve exited {process.returncode}:\n{output}")
        try:
            return httpx.get(f"{url}/health", timeout=1).status_code == 200
        except httpx.TransportError:
            return False

    try:
        wait_until(healthy, 60, "the service to start")
        yield url, process
    finally:
        if process.poll() is None:
            process.kill()
        process.communicate(timeout=30)
        if log:
            log.close()
