"""The cost model against a real engine: predicted against measured wall times.

Against a running vLLM OpenAI server (``--upstream``, its ``/v1``): calibrates it
(``blendserve calibrate``, widths ``--widths``), runs SC@32 (``policy: sc``) and a
default job (``budget_per_question`` 8) of two counting questions through a
blendserve in this process in front of it, at most ``--width`` samples in flight a
job, answered greedily (every sample of a question the same line, about 30 tokens,
so that lengths are known), then predicts both with the replay engine on the
calibrated profile (:mod:`blendserve.testing.cost_model`) and prints predicted against
measured, and their ratios. The vLLM lane runs the same comparison.

Usage: python -m bench.engines.cost_model --upstream http://127.0.0.1:8001/v1
    [--widths 1,4,8] [--width 8] [--scale 0.25]
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from blendserve.cli import main as blendserve
from blendserve.testing.cost_model import compare


def main() -> int:
    """Calibrates, runs the comparison and prints it."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--upstream", required=True, help="a vLLM OpenAI server's /v1 URL")
    parser.add_argument("--widths", default="1,4,8", help="calibrated widths")
    parser.add_argument("--width", type=int, default=8, help="samples in flight a job")
    parser.add_argument("--scale", type=float, default=0.25, help="replay time scale")
    args = parser.parse_args()
    profile = Path(tempfile.mkdtemp()) / "profile.jsonl"
    calibrate = ["calibrate", "--upstream", args.upstream, "--out", str(profile), "--widths",
                 args.widths, "--contexts", "32,128", "--tokens", "8,32",
                 "--reps", "5"]  # fmt: skip
    if blendserve(calibrate) != 0:
        return 1
    print(compare(args.upstream, profile, args.width, args.scale).describe())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
