"""vLLM's OpenAI server (or ``blendserve serve --engine vllm``) as an outside process.

Started in a process group of its own, so that vLLM's engine core and workers stop
with it; shared by the vLLM lane's tests and ``python -m bench.traces.logprobs``.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import httpx

#: vLLM's CPU KV cache, in GiB: the default wants most of the machine's memory.
ENV = {"VLLM_CPU_KVCACHE_SPACE": "2"}
#: Seconds vLLM may take to start on 2 busy cores (model load and torch.compile).
STARTUP_S = 600


def _stop(process: subprocess.Popen[bytes], timeout: float = 60) -> None:
    """SIGTERM to the process group (vLLM's engine core and workers too), then SIGKILL."""
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(30)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)  # leftovers of the group, if any


def group_alive(process: subprocess.Popen[bytes]) -> bool:
    """Whether any process of ``process``'s group (its children included) still runs."""
    try:
        os.killpg(process.pid, 0)
    except ProcessLookupError:
        return False
    return True


@contextmanager
def start(
    command: Sequence[str], log: Path, health: str, cwd: Path | None = None
) -> Iterator[subprocess.Popen[bytes]]:
    """``command`` (run in ``cwd``, this process's own by default) in a process group of its
    own, once ``health`` answers 200; stopped after, its output in ``log``."""
    with log.open("wb") as out:
        process = subprocess.Popen(
            list(command),
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**os.environ, **ENV},
            start_new_session=True,
            cwd=cwd,
        )
        try:
            deadline = time.monotonic() + STARTUP_S
            while True:
                if process.poll() is not None:
                    tail = log.read_bytes()[-4000:].decode(errors="replace")
                    raise AssertionError(f"{command[:4]} exited {process.returncode}:\n{tail}")
                try:
                    if httpx.get(health, timeout=2).status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                assert time.monotonic() < deadline, f"{command[:4]} did not start"
                time.sleep(1)
            yield process
        finally:
            _stop(process)
