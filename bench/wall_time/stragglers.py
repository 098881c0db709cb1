"""Stragglers on an engine of unknown capacity: when a job's answers come.

Starts the fake OpenAI upstream (:mod:`blendserve.testing.fake_openai`) whose every
``--slow-every``-th completion request takes ``--slow-latency`` more seconds,
and the real ``blendserve serve --upstreams URL`` in front of it, then sends
one streamed ``POST /solve`` of ``--questions`` unanimous questions and
``--budget`` samples, and prints when its first and last answers came and
when it was done. Three runs: no stragglers, stragglers with no
``--engine-capacity``, stragglers with ``--engine-capacity 64``.

Usage::

    python -m bench.wall_time.stragglers [--questions 20] [--budget 320]
        [--latency 0.1] [--slow-every 5] [--slow-latency 20]
"""

from __future__ import annotations

import argparse
import json
import time

import httpx
from blendserve.testing.command import serve_command
from blendserve.testing.fake_openai import FakeServer, FakeState


def solve(url: str, questions: int, budget: int) -> dict[str, float]:
    """Seconds from the request to the first answer, the last answer and ``done``."""
    body = {
        "questions": [
            {"id": f"q{i}", "messages": [{"role": "user", "content": f"What is {i} + 42 - {i}?"}]}
            for i in range(questions)
        ],
        "budget": budget,
        "answer": {"kind": "number"},
        "stream": True,
    }
    times: list[float] = []
    start = time.monotonic()
    with httpx.stream("POST", f"{url}/solve", json=body, timeout=3600) as response:
        response.raise_for_status()
        name = ""
        for line in response.iter_lines():
            if line.startswith("event:"):
                name = line[6:].strip()
            elif line.startswith("data:") and name == "answer":
                times.append(time.monotonic() - start)
            elif line.startswith("data:") and name == "done":
                done = json.loads(line[5:])
                return {
                    "first": times[0],
                    "last": times[-1],
                    "done": time.monotonic() - start,
                    "spent": done["budget"]["spent"],
                }
    raise RuntimeError("the stream ended with no done event")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--questions", type=int, default=20)
    parser.add_argument("--budget", type=int, default=320)
    parser.add_argument("--latency", type=float, default=0.1, help="seconds of every sample")
    parser.add_argument("--slow-every", type=int, default=5)
    parser.add_argument("--slow-latency", type=float, default=20.0)
    args = parser.parse_args()
    runs = [
        ("no stragglers", 0, ()),
        ("stragglers, capacity unknown", args.slow_every, ()),
        ("stragglers, --engine-capacity 64", args.slow_every, ("--engine-capacity", "64")),
    ]
    print("| run | first answer (s) | last answer (s) | done (s) | samples spent |")
    print("|---|---:|---:|---:|---:|")
    for label, every, flags in runs:
        state = FakeState(
            answers=("42",),
            latency=args.latency,
            slow_every=every,
            slow_latency=args.slow_latency,
            record=False,
        )
        with (
            FakeServer(state) as upstream,
            serve_command("--upstreams", upstream.url, *flags) as (
                url,
                _,
            ),
        ):
            got = solve(url, args.questions, args.budget)
        print(
            f"| {label} | {got['first']:.1f} | {got['last']:.1f} | {got['done']:.1f} "
            f"| {got['spent']:.0f} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
