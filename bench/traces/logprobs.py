"""What reading confidence costs: generation tokens a second with top logprobs asked or not.

For each engine, the same requests (``--prompts`` prompts, ``--n`` samples each, all in
flight at once, every sample ``--max-tokens`` long: end-of-sequence ignored) are timed
with no logprobs asked (k = 0) and with a :class:`~blendserve.core.signals.ConfidenceSpec`
of each top-logprobs k in ``--ks``, through blendserve's own engines, so that reading
the logprobs into each sample's confidence is counted too (chat requests: the OpenAI
servers are asked for k + 1 up to 20, as the engine asks). Rounds take the k's in turn,
in reverse every other time, ``--reps`` times after short warm-up rounds (k = 0 and the
largest), and each k's median is kept. Engines (``--engines``):

- ``embedded``: the embedded default, llama-cpp-python's OpenAI server on the embedded
  model, streamed as the embedded engine asks;
- ``vllm``: vLLM's OpenAI server from the vLLM venv (``--vllm-python``, the model at
  ``--vllm-model``), started on a free loopback port, through the OpenAI engine, one
  reply a request as an upstream without a stall timeout is asked;
- ``vllm-inprocess``: vLLM's ``AsyncLLM`` in-process (run under the vLLM venv's python
  when this one has no vLLM).

Prints a table: engine, k, tokens a second, and the ratio to k = 0.

Usage: python -m bench.traces.logprobs [--engines embedded vllm vllm-inprocess]
    [--ks 1 5 20] [--prompts 2] [--n 2] [--max-tokens 16] [--reps 2]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import tempfile
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from blendserve.core.signals import MAX_TOP_LOGPROBS, ConfidenceSpec
from blendserve.engines.base import Engine, GenerateRequest, SamplingParams
from blendserve.engines.config import Timeouts

ROOT = Path(__file__).resolve().parents[2]
#: The vLLM lane's venv and model (.ci/vllm-lane), and the name both engines serve.
VLLM_VENV = ROOT / ".venv-vllm"
MODEL = "qwen2.5-coder-0.5b"
#: vLLM's CPU KV cache, in GiB, unless set: the default wants most of the machine's memory.
VLLM_ENV = {"VLLM_CPU_KVCACHE_SPACE": "2"}
PROMPTS = [
    "Count from 1 to 500, separated by commas.",
    "Write a long story about a lighthouse keeper who counts ships.",
    "List the countries of the world with their capitals, one per line.",
    "Explain, step by step, how a hash table handles collisions.",
    "Write the multiplication tables from 1 to 12.",
    "Describe the water cycle in detail.",
    "Write a Python function that sorts a list, then explain each line.",
    "Name as many animals as you can, one per line.",
]
#: The embedded model's end-of-text tokens, biased away so that every sample runs to
#: ``--max-tokens`` (llama.cpp has no ``ignore_eos``).
QWEN_ENDS = ("151643", "151645")
ENGINES = ("embedded", "vllm", "vllm-inprocess")
#: Whether each OpenAI server is streamed by default (``--stream auto``): as the service asks.
STREAMED = {"embedded": True, "vllm": False}


def _requests(args: argparse.Namespace, k: int, extra: dict[str, Any]) -> list[GenerateRequest]:
    """The round's requests at top-logprobs ``k`` (0: none asked)."""
    spec = ConfidenceSpec(top_logprobs=k).scaled(args.max_tokens) if k else None
    params = SamplingParams(max_tokens=args.max_tokens, temperature=0.8, extra=extra)
    return [
        GenerateRequest(
            messages=[{"role": "user", "content": PROMPTS[i % len(PROMPTS)]}],
            n=args.n,
            params=params,
            confidence=spec,
        )
        for i in range(args.prompts)
    ]


async def _round(engine: Engine, requests: list[GenerateRequest]) -> tuple[float, int]:
    """Seconds the requests took, all in flight at once, and the tokens they generated."""
    started = time.perf_counter()
    results = await asyncio.gather(*(engine.generate(r) for r in requests))
    seconds = time.perf_counter() - started
    samples = [s for result in results for s in result]
    if any((s.confidence is None) != (r.confidence is None) for r in requests for s in samples):
        raise SystemExit("a sample's confidence was not read as its request asked")
    return seconds, sum(s.completion_tokens for s in samples)


async def measure(
    name: str, engine: Engine, args: argparse.Namespace, extra: dict[str, Any]
) -> list[tuple[str, int, float]]:
    """Tokens a second at each k (0 first) on ``engine``: the median over ``--reps``."""
    ks = [0, *args.ks]
    warm = argparse.Namespace(**{**vars(args), "max_tokens": min(8, args.max_tokens)})
    for k in (0, max(ks)):  # warm-up: the width compiled, the server's first request paid
        await _round(engine, _requests(warm, k, extra))
    speeds: dict[int, list[float]] = {k: [] for k in ks}
    for rep in range(args.reps):
        for k in ks if rep % 2 == 0 else reversed(ks):  # each k early and late in turn
            seconds, tokens = await _round(engine, _requests(args, k, extra))
            speeds[k].append(tokens / seconds)
    return [(name, k, statistics.median(speeds[k])) for k in ks]


def _streamed(args: argparse.Namespace, name: str) -> bool:
    return STREAMED[name] if args.stream == "auto" else args.stream == "yes"


@asynccontextmanager
async def embedded(args: argparse.Namespace) -> AsyncIterator[Engine]:
    """The embedded default: llama-cpp-python's server, through the OpenAI engine."""
    from blendserve.engines.embedded import EmbeddedLlamaServer, ensure_model
    from blendserve.engines.openai import OpenAIEngine

    cache = Path(tempfile.gettempdir()) / "blendserve-models"
    path = await asyncio.to_thread(ensure_model, "qwen2.5-coder-0.5b", cache)
    server = EmbeddedLlamaServer(path, model_name=MODEL, n_ctx=2048)
    await server.start()
    try:
        engine = OpenAIEngine(
            [server.base_url],
            stream=_streamed(args, "embedded"),
            timeouts=Timeouts(call=args.timeout),
        )
        async with engine:
            yield engine
    finally:
        await server.aclose()


@asynccontextmanager
async def vllm_upstream(args: argparse.Namespace) -> AsyncIterator[Engine]:
    """vLLM's OpenAI server from the vLLM venv, through the OpenAI engine."""
    from blendserve.engines.openai import OpenAIEngine
    from blendserve.testing.command import free_port  # httpx: not in the vLLM venv
    from blendserve.testing.vllm import start

    port = free_port()
    command = [
        str(args.vllm_python), "-m", "vllm.entrypoints.openai.api_server",
        "--model", str(args.vllm_model), "--served-model-name", MODEL,
        "--host", "127.0.0.1", "--port", str(port), "--max-model-len", "2048",
    ]  # fmt: skip
    log = Path(tempfile.mkdtemp()) / "vllm.log"
    with start(command, log, f"http://127.0.0.1:{port}/health", cwd=ROOT):
        engine = OpenAIEngine(
            [f"http://127.0.0.1:{port}/v1"],
            stream=_streamed(args, "vllm"),
            timeouts=Timeouts(call=args.timeout),
            model=MODEL,
        )
        async with engine:
            yield engine


@asynccontextmanager
async def vllm_inprocess(args: argparse.Namespace) -> AsyncIterator[Engine]:
    """vLLM's ``AsyncLLM`` in this process."""
    from blendserve.engines.vllm_inprocess import VLLMEngine

    engine = VLLMEngine({"model": str(args.vllm_model), "max_model_len": 2048}, name=MODEL)
    try:
        yield engine
    finally:
        await engine.aclose()


STARTERS: dict[str, Callable[[argparse.Namespace], Any]] = {
    "embedded": embedded,
    "vllm": vllm_upstream,
    "vllm-inprocess": vllm_inprocess,
}
EXTRA: dict[str, dict[str, Any]] = {
    "embedded": {"logit_bias": {token: -100 for token in QWEN_ENDS}},
    "vllm": {"ignore_eos": True},
    "vllm-inprocess": {"ignore_eos": True},
}


def _has_vllm() -> bool:
    try:
        import vllm  # noqa: F401
    except ImportError:
        return False
    return True


def _in_vllm_venv(args: argparse.Namespace) -> None:
    """Runs the in-process engine's rows under the vLLM venv's python (its rows printed)."""
    argv = [str(args.vllm_python), "-m", "bench.traces.logprobs",
            "--engines", "vllm-inprocess", "--no-header",
            "--ks", *map(str, args.ks), "--prompts", str(args.prompts), "--n", str(args.n),
            "--max-tokens", str(args.max_tokens), "--reps", str(args.reps),
            "--vllm-model", str(args.vllm_model), "--stream", args.stream]  # fmt: skip
    path = os.pathsep.join([str(ROOT / "server"), str(ROOT / "client"), str(ROOT)])
    env = {**os.environ, "PYTHONPATH": path}
    subprocess.run(argv, check=True, env=env, cwd=ROOT)


def _row(name: str, k: int, speed: float, none: float) -> str:
    return f"| {name} | {k or 'none'} | {speed:.1f} | {speed / none:.2f} |"


async def main_async(args: argparse.Namespace) -> None:
    """Prints each engine's rows as it is measured."""
    for name in args.engines:
        if name == "vllm-inprocess" and not _has_vllm():
            _in_vllm_venv(args)
            continue
        async with STARTERS[name](args) as engine:
            rows = await measure(name, engine, args, EXTRA[name])
        none = rows[0][2]
        for row in rows:
            print(_row(*row, none), flush=True)


def main() -> None:
    """Parses the flags, measures and prints the table."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--engines", nargs="+", choices=ENGINES, default=list(ENGINES))
    parser.add_argument("--ks", type=int, nargs="+", default=[1, 5, 20], help="top logprobs")
    parser.add_argument("--prompts", type=int, default=2, help="requests in flight at once")
    parser.add_argument("--n", type=int, default=2, help="samples a request")
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--reps", type=int, default=2, help="measured rounds of each k")
    parser.add_argument("--stream", choices=("auto", "yes", "no"), default="auto",
                        help="stream the OpenAI servers' replies (auto: as the service "
                        "does, the embedded one's alone)")  # fmt: skip
    parser.add_argument("--timeout", type=float, default=1800, help="seconds a request")
    parser.add_argument("--vllm-python", type=Path, default=VLLM_VENV / "bin" / "python")
    parser.add_argument("--vllm-model", type=Path, default=VLLM_VENV / "model")
    parser.add_argument("--no-header", dest="header", action="store_false")
    args = parser.parse_args()
    if not all(1 <= k <= MAX_TOP_LOGPROBS for k in args.ks):
        parser.error(f"--ks: each k must be 1..{MAX_TOP_LOGPROBS} (k = 0, none, is always run)")
    for key, value in VLLM_ENV.items():
        os.environ.setdefault(key, value)
    if args.header:
        print(
            f"{args.prompts} requests of n={args.n} in flight, {args.max_tokens} tokens each, "
            f"median of {args.reps} rounds; OpenAI servers streamed: {args.stream}"
        )
        print("| engine | top logprobs | tokens/s | ratio to none |\n|---|---|---|---|")
    asyncio.run(main_async(args))


if __name__ == "__main__":
    main()
