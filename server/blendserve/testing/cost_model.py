"""The cost model against a real engine: a job's wall time predicted and measured.

Two greedy counting questions (every sample of a question the same line, so
lengths are known) are asked as SC@32 and as a job of the default policy at
8 samples a question, through a blendserve in this process in front of the
engine, told it runs ``width`` sequences at once; each job keeps ``width``
samples in flight (the default job decides sample by sample, so both run at
one width); then the replay engine on the engine's calibrated profile (the
SC@32 run's answers and mean length, ``width`` sequences at once) predicts
both. In waves the default job runs narrower rounds, where a line fitted
through the widths calibrated can miss (docs/engines.md). Used by
``python -m bench.engines.cost_model`` and the vLLM lane.

A shared host has slow spells. So each job is measured three times, taking
turns, the fastest its measure; the default job's measure is
:data:`DEFAULT_REPEATS` runs back to back (about SC@32's time, so that a spell
weighs on both alike); and the prediction is made on the calibration's
fastest repetitions, the same estimate of the engine's speed.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from blendserve.engines.replay import LatencyModel, ReplayEngine
from blendserve.engines.step_cost import load_step_cost
from blendserve.service import Settings, create_app
from blendserve.testing.live import LiveServer, serve_engine

__all__ = ["Comparison", "compare"]

QUESTIONS = [
    {"id": "c0", "prompt": "Count from 1 to 10, separated by commas:\n"},
    {"id": "c1", "prompt": "Count up from 1 to 10, separated by commas:\n"},
]
GREEDY = {"temperature": 0.0, "max_tokens": 96, "stop": ["\n"]}
SC = {"budget_per_question": 32, "policy": "sc", "in_flight_per_question": 32}
DEFAULT = {"budget_per_question": 8, "max_rounds": 0, "in_flight_per_question": 32}
#: Default jobs run back to back for one measure of one: 4 x 16 samples, SC@32's 64.
DEFAULT_REPEATS = 4


@dataclass(frozen=True)
class Comparison:
    """Measured and predicted seconds of SC@32 and of the default job."""

    length: float
    width: int
    default_samples: int
    sc_runs: tuple[float, ...]
    sc_predicted: float
    default_runs: tuple[float, ...]
    default_predicted: float

    @property
    def sc_measured(self) -> float:
        """SC@32's fastest run."""
        return min(self.sc_runs)

    @property
    def default_measured(self) -> float:
        """The default job's fastest measure (a run's mean over its repeats)."""
        return min(self.default_runs)

    @property
    def ratio_error(self) -> float:
        """Predicted default/SC@32 ratio over the measured one, less 1."""
        predicted = self.default_predicted / self.sc_predicted
        return predicted / (self.default_measured / self.sc_measured) - 1

    def describe(self) -> str:
        """Predicted against measured, a line each."""
        sc, default = self.sc_predicted, self.default_predicted
        return (
            f"{self.length:.1f} tokens a sample, at most {self.width} in flight\n"
            f"SC@32:   measured {self.sc_measured:.1f} s ({_runs(self.sc_runs)}), "
            f"predicted {sc:.1f} s ({sc / self.sc_measured:.2f}x)\n"
            f"default: measured {self.default_measured:.1f} s ({_runs(self.default_runs)}; "
            f"{self.default_samples} samples), predicted {default:.1f} s "
            f"({default / self.default_measured:.2f}x)\n"
            f"default / SC@32: measured {self.default_measured / self.sc_measured:.3f}, "
            f"predicted {default / sc:.3f} ({self.ratio_error + 1:.2f}x)"
        )


def _runs(seconds: tuple[float, ...]) -> str:
    return "measures " + ", ".join(f"{s:.1f}" for s in seconds)


def _timed_solve(url: str, width: int, body: dict[str, Any]) -> tuple[float, dict[str, Any]]:
    """Seconds a ``/solve`` of :data:`QUESTIONS` took, and its result."""
    request = {"questions": QUESTIONS, "answer": {"kind": "number"}, "sampling": GREEDY,
               "concurrency": width, **body}  # fmt: skip
    started = time.monotonic()
    response = httpx.post(f"{url}/solve", json=request, timeout=3600).raise_for_status()
    return time.monotonic() - started, response.json()


def _predicted(
    profile: Path, records: list[dict[str, Any]], length: float, width: int, scale: float,
    body: dict[str, Any],
) -> float:  # fmt: skip
    """Seconds the replay engine on ``profile`` takes for the job, in the engine's time."""
    latency = LatencyModel(
        length=(math.log(length), 0.0),
        step_cost=load_step_cost(profile),
        max_concurrent_sequences=width,
        time_scale=scale,
    )
    engine = ReplayEngine(records, latency=latency, seed=1)
    with serve_engine(engine, default_concurrency=64) as live:
        seconds, _ = _timed_solve(live.url, width, body)
    return seconds / scale


def _fastest(profile: Path) -> Path:
    """``profile`` with each point's fastest repetition as its time (written beside it)."""
    lines = profile.read_text(encoding="utf-8").splitlines()
    points = [json.loads(line) for line in lines if line.strip()]
    fastest = profile.with_name(f"{profile.stem}-fastest.jsonl")
    fastest.write_text(
        "".join(json.dumps({**p, "ms_median": p["ms_min"]}) + "\n" for p in points),
        encoding="utf-8",
    )
    return fastest


def compare(
    upstream: str, profile: Path, width: int = 8, scale: float = 0.25, runs: int = 3
) -> Comparison:
    """Both jobs measured ``runs`` times each, taking turns, through blendserve in front of
    ``upstream`` (a ``/v1`` URL), then predicted on ``profile``'s fastest repetitions by
    the replay engine at ``scale`` times its speed."""
    app = create_app(Settings(upstreams=(upstream,), group_wait_ms=0, engine_capacity=width))
    sc_runs, default_runs = [], []
    with LiveServer(app, timeout=60) as live:
        for _ in range(runs):
            sc_runs.append(_timed_solve(live.url, width, SC))
            repeats = [_timed_solve(live.url, width, DEFAULT) for _ in range(DEFAULT_REPEATS)]
            default_runs.append((sum(t for t, _ in repeats) / DEFAULT_REPEATS, repeats[0][1]))
    sc = sc_runs[0][1]
    profile = _fastest(profile)
    records = [
        {"id": a["id"], "prompt": q["prompt"],
         "answers": [v for v, k in a["votes"].items() for _ in range(k)]}
        for a, q in zip(sc["answers"], QUESTIONS, strict=True)
    ]  # fmt: skip
    length = sc["usage"]["completion_tokens"] / sc["usage"]["samples"]
    return Comparison(
        length=length,
        width=width,
        default_samples=default_runs[0][1]["budget"]["spent"],
        sc_runs=tuple(seconds for seconds, _ in sc_runs),
        sc_predicted=_predicted(profile, records, length, width, scale, SC),
        default_runs=tuple(seconds for seconds, _ in default_runs),
        default_predicted=_predicted(profile, records, length, width, scale, DEFAULT),
    )
