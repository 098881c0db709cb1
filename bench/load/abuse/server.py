"""``blendserve serve`` as a process of its own on loopback, for ``python -m bench.load.abuse``.

:func:`serve` starts the real command with the flags given (an upstream, the
replay engine's data, timeouts), waits until ``/health`` answers and stops it
at the end; :func:`usage` and :func:`rss_kib` read the process's descriptors
and memory from ``/proc``.
"""

from __future__ import annotations

import contextlib
import os
import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import httpx
from blendserve.testing.command import free_port

__all__ = ["Served", "rss_kib", "serve", "usage"]


@dataclass(frozen=True)
class Served:
    """A running ``blendserve serve``: its process, base URL, port and log file."""

    process: subprocess.Popen[bytes]
    url: str
    port: int
    log: Path

    @property
    def pid(self) -> int:
        """The server's process id."""
        return self.process.pid

    def log_text(self) -> str:
        """What the server logged so far."""
        return self.log.read_text(errors="replace")


def _fd_limit(fds: int) -> Callable[[], None]:
    def limit() -> None:
        _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(fds, hard), hard))

    return limit


@contextlib.contextmanager
def serve(
    flags: Sequence[str], *, fds: int | None = None, timeout: float = 60.0
) -> Iterator[Served]:
    """``blendserve serve FLAGS`` on a free loopback port, until the block ends.

    Args:
        flags: the command's flags (an engine and its options).
        fds: the soft limit of open descriptors it starts with (None: this process's).
        timeout: seconds it gets to answer ``/health`` (any status: a 503 says it serves).
    """
    port = free_port()
    command = [
        sys.executable, "-m", "blendserve.cli", "serve", *flags,
        "--host", "127.0.0.1", "--port", str(port), "--log-level", "warning",
    ]  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        log = Path(tmp) / "server.log"
        with log.open("w") as stderr:
            process = subprocess.Popen(
                command,
                stdout=subprocess.DEVNULL,
                stderr=stderr,
                preexec_fn=None if fds is None else _fd_limit(fds),
            )
        served = Served(process, f"http://127.0.0.1:{port}", port, log)
        try:
            _wait_serving(served, timeout)
            yield served
        finally:
            process.kill()
            process.wait(30)


def _wait_serving(served: Served, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while True:
        with contextlib.suppress(httpx.TransportError):
            httpx.get(f"{served.url}/health", timeout=1)
            return
        if served.process.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"the server did not start:\n{served.log_text()}")
        time.sleep(0.1)


def _children(pid: int) -> list[int]:
    children: list[int] = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(OSError):
            children += [int(c) for c in (task / "children").read_text().split()]
    return children


def rss_kib(pid: int, children: bool = False) -> int:
    """The resident memory of process ``pid`` in KiB, its children's (sympy workers) added."""
    status = Path(f"/proc/{pid}/status").read_text().splitlines()
    rss = next(int(line.split()[1]) for line in status if line.startswith("VmRSS:"))
    if children:
        for child in _children(pid):
            with contextlib.suppress(OSError, StopIteration):
                rss += rss_kib(child, children=True)
    return rss


def usage(pid: int) -> str:
    """The process's open descriptors and resident memory, in words."""
    fds = len(os.listdir(f"/proc/{pid}/fd"))
    return f"{fds} fds, RSS {rss_kib(pid) / 1024:.0f} MiB"
