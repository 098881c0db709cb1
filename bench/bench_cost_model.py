"""The cost model against a real engine: predicted against measured wall times.

Against a running vLLM OpenAI server (``--upstream``, its ``/v1``): calibrates it
(``blendserve calibrate``, widths ``--widths``), runs SC@32 (``policy: sc``) and a
default job (``budget_per_question`` 8) of two counting questions through a
blendserve in this process in front of it, at most ``--width`` samples in flight a
job, answered greedily (every sample of a question the same line, about 30 tokens,
so that lengths are known), then predicts both with the replay engine on the
calibrated profile (the SC@32 run's answers and mean length, the engine's
``--width`` sequences) and prints predicted against measured, and their ratios.

Usage: python bench/bench_cost_model.py --upstream http://127.0.0.1:8001/v1
    [--widths 1,4,8] [--width 8] [--scale 0.25]
"""

from __future__ import annotations

import argparse
import math
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from blendserve.cli import main as blendserve
from blendserve.engines.replay import LatencyModel, ReplayEngine
from blendserve.engines.step_cost import load_step_cost
from blendserve.service import Settings, create_app

from tests.support.live import LiveServer, serve_engine

QUESTIONS = [
    {"id": "c0", "prompt": "Count from 1 to 10, separated by commas:\n"},
    {"id": "c1", "prompt": "Count up from 1 to 10, separated by commas:\n"},
]
GREEDY = {"temperature": 0.0, "max_tokens": 96, "stop": ["\n"]}


def timed_solve(url: str, width: int, **body: Any) -> tuple[float, dict[str, Any]]:
    """Seconds a ``/solve`` of :data:`QUESTIONS` took, and its result."""
    request = {"questions": QUESTIONS, "answer": {"kind": "number"}, "sampling": GREEDY,
               "concurrency": width, **body}  # fmt: skip
    started = time.monotonic()
    response = httpx.post(f"{url}/solve", json=request, timeout=3600).raise_for_status()
    return time.monotonic() - started, response.json()


def predicted(
    profile: Path, records: list[dict[str, Any]], length: float, width: int, scale: float,
    **body: Any,
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
        seconds, _ = timed_solve(live.url, width, **body)
    return seconds / scale


def main() -> int:
    """Runs the comparison; prints one line per job and the ratios."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--upstream", required=True, help="a vLLM OpenAI server's /v1 URL")
    parser.add_argument("--widths", default="1,4,8", help="calibrated widths")
    parser.add_argument("--width", type=int, default=8, help="samples in flight a job")
    parser.add_argument("--scale", type=float, default=0.25, help="replay time scale")
    args = parser.parse_args()
    profile = Path(tempfile.mkdtemp()) / "profile.jsonl"
    calibrate = ["calibrate", "--upstream", args.upstream, "--out", str(profile), "--widths",
                 args.widths, "--contexts", "32,128", "--tokens", "8,32",
                 "--reps", "2"]  # fmt: skip
    if blendserve(calibrate) != 0:
        return 1
    app = create_app(Settings(upstreams=(args.upstream,), group_wait_ms=0))
    with LiveServer(app, timeout=60) as live:
        sc_s, sc = timed_solve(live.url, args.width, budget_per_question=32, policy="sc")
        default_s, default = timed_solve(live.url, args.width, budget_per_question=8)
    records = [
        {"id": a["id"], "prompt": q["prompt"],
         "answers": [v for v, k in a["votes"].items() for _ in range(k)]}
        for a, q in zip(sc["answers"], QUESTIONS, strict=True)
    ]  # fmt: skip
    length = sc["usage"]["completion_tokens"] / sc["usage"]["samples"]
    sc_p = predicted(profile, records, length, args.width, args.scale,
                     budget_per_question=32, policy="sc")  # fmt: skip
    default_p = predicted(profile, records, length, args.width, args.scale,
                          budget_per_question=8)  # fmt: skip
    print(f"{length:.1f} tokens a sample, at most {args.width} in flight")
    print(f"SC@32:   measured {sc_s:.1f} s, predicted {sc_p:.1f} s ({sc_p / sc_s:.2f}x)")
    print(f"default: measured {default_s:.1f} s ({default['budget']['spent']} samples), "
          f"predicted {default_p:.1f} s ({default_p / default_s:.2f}x)")  # fmt: skip
    ratio = (default_p / sc_p) / (default_s / sc_s)
    print(f"default / SC@32: measured {default_s / sc_s:.3f}, predicted "
          f"{default_p / sc_p:.3f} ({ratio:.2f}x)")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
