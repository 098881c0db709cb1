"""CPU the OpenAI engine spends reading a runaway streamed sample, per MiB.

Usage: python -m bench.engines.runaway_stream [--mib 64] [--reps 3] [--shape tokens|events|line]
       [--max-tokens N]

The fake upstream of :mod:`blendserve.testing.fake_openai` runs in a separate
process and streams an answer that never ends: ``tokens`` (the default) in
events of a few characters each, as a model writes token by token (about
75 bytes an event); ``events`` in events of 4 KiB; ``line`` in one line that
never ends, sent 4 KiB at a time. The engine here streams one sample from it until the response size
limit (``--mib``) fails the attempt. The CPU this process used over that read
(``time.process_time``), divided by the MiB read, is what parsing a stream
costs the service's event loop; the fake's own CPU is not in it. With
``--max-tokens``, the sample asks for that many tokens, and the read ends once
the stream sends more pieces than they allow (the CPU is then per attempt).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import subprocess
import time

from blendserve.engines import GenerateRequest, SamplingParams
from blendserve.engines.config import Limits, RetryPolicy, Timeouts
from blendserve.engines.openai import OpenAIEngine
from blendserve.errors import EngineProtocolError

from bench.engines.openai_engine import spawn_fake


def _spawn_endless(shape: str) -> tuple[subprocess.Popen[str], str]:
    flags = {
        "tokens": ["--endless", "--endless-piece", "4"],
        "events": ["--endless"],
        "line": ["--endless-line"],
    }[shape]
    return spawn_fake(*flags)


async def _read_once(url: str, mib: int, max_tokens: int | None) -> tuple[float, float]:
    """CPU seconds and wall seconds of one runaway sample read until it is cut."""
    async with OpenAIEngine(
        [url],
        stream=True,
        timeouts=Timeouts(call=600.0, stall=30.0),
        limits=Limits(response_bytes=mib << 20),
        retry=RetryPolicy(max_retries=0),
    ) as engine:
        cpu, wall = time.process_time(), time.monotonic()
        try:
            params = SamplingParams(max_tokens=max_tokens)
            await engine.generate(GenerateRequest(prompt="run away", params=params))
        except EngineProtocolError as exc:
            if "over" not in str(exc):
                raise
        else:
            raise AssertionError("the runaway sample was not cut at the size limit")
        return time.process_time() - cpu, time.monotonic() - wall


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--mib", type=int, default=64)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--shape", choices=("tokens", "events", "line"), default="tokens")
    parser.add_argument("--max-tokens", type=int, default=None)
    args = parser.parse_args()
    proc, url = _spawn_endless(args.shape)
    try:
        runs = [asyncio.run(_read_once(url, args.mib, args.max_tokens)) for _ in range(args.reps)]
    finally:
        proc.kill()
        proc.wait()
    cpu = statistics.median(c for c, _ in runs)
    wall = statistics.median(w for _, w in runs)
    print(
        f"runaway stream ({args.shape}, max_tokens {args.max_tokens}), cap {args.mib} MiB:"
        f" median CPU {cpu:.2f} s, wall {wall:.2f} s, over {args.reps} reads"
    )


if __name__ == "__main__":
    main()
