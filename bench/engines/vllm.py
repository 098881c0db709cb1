"""Wave time on a real vLLM, and what blendserve adds in front of it.

Against a running vLLM OpenAI server (``--upstream``, its ``/v1``) and a
blendserve in front of it (``--service``, ``--upstreams`` set to it), for
each ``n``: the wall time of one chat completion of ``n`` samples of
``--max-tokens`` tokens (``ignore_eos``, seeded: the same work every time)
sent straight to vLLM, the same request passed through blendserve
(``blendserve.enabled: false``), and a voted ``POST /solve`` of one question
whose ``n`` samples go as one request (policy ``sc``, concurrency ``n``),
next to a direct request of the same prompt, sampling and ``n``.
Medians over ``--reps``, requests one at a time.

Usage: python -m bench.engines.vllm --upstream http://127.0.0.1:8001/v1
    --service http://127.0.0.1:8000 [--n 1 8 32] [--reps 3] [--max-tokens 128]
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

import httpx

LONG = "Write the numbers from 1 to 3000, one per line."
QUESTION = "What is 12 * 12? Answer in one short sentence."


def timed(client: httpx.Client, url: str, body: dict[str, Any]) -> tuple[float, dict[str, Any]]:
    """Seconds a POST took, and its JSON reply (an HTTP error raises)."""
    start = time.perf_counter()
    reply = client.post(url, json=body).raise_for_status()
    return time.perf_counter() - start, reply.json()


def median(runs: list[float]) -> float:
    """The median, in seconds."""
    return statistics.median(runs)


def main() -> None:
    """Prints one table row per ``n``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--upstream", required=True, help="vLLM's /v1 URL")
    parser.add_argument("--service", required=True, help="blendserve's URL (in front of it)")
    parser.add_argument("--model", default="qwen2.5-coder-0.5b")
    parser.add_argument("--n", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=128)
    args = parser.parse_args()
    client = httpx.Client(timeout=1800)
    print(
        "| n | vLLM direct s | passed through s | overhead ms | voted /solve s, tokens "
        "| vLLM direct, same prompt s, tokens |"
    )
    print("|---|---|---|---|---|---|")
    for n in args.n:
        fixed = {
            "model": args.model, "messages": [{"role": "user", "content": LONG}], "n": n,
            "max_tokens": args.max_tokens, "temperature": 0.8, "seed": 1, "ignore_eos": True,
        }  # fmt: skip
        question = [{"role": "user", "content": QUESTION}]
        sampling = {"temperature": 0.8, "max_tokens": args.max_tokens}
        direct, passed, voted, same = [], [], [], []
        voted_tokens, same_tokens = [], []
        through = {**fixed, "blendserve": {"enabled": False}}
        solve = {
            "questions": [{"messages": question}], "budget": n, "policy": "sc",
            "concurrency": n, "answer": {"kind": "number"}, "sampling": sampling,
        }  # fmt: skip
        plain = {"model": args.model, "messages": question, "n": n, **sampling}
        chat = f"{args.upstream}/chat/completions"
        for _ in range(args.reps):
            direct.append(timed(client, chat, fixed)[0])
            passed.append(timed(client, f"{args.service}/v1/chat/completions", through)[0])
            seconds, result = timed(client, f"{args.service}/solve", solve)
            voted.append(seconds)
            voted_tokens.append(result["usage"]["completion_tokens"])
            seconds, reply = timed(client, chat, plain)
            same.append(seconds)
            same_tokens.append(reply["usage"]["completion_tokens"])
        overhead = (median(passed) - median(direct)) * 1000
        print(
            f"| {n} | {median(direct):.2f} | {median(passed):.2f} | {overhead:+.0f} "
            f"| {median(voted):.2f}, {statistics.fmean(voted_tokens):.0f} "
            f"| {median(same):.2f}, {statistics.fmean(same_tokens):.0f} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
