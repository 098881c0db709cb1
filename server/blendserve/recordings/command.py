"""``blendserve record``: record a questions file against an engine (docs/recordings.md)."""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

from blendserve.core.answers import KINDS
from blendserve.core.signals import MAX_TOP_LOGPROBS, ConfidenceSpec
from blendserve.engines.base import SamplingParams
from blendserve.engines.factory import EngineConfig, build_engine
from blendserve.recordings.recorder import (
    Question,
    RecordPlan,
    print_progress,
    read_questions,
    record,
)

__all__ = ["add_parser", "run"]


def add_parser(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Registers the ``record`` subcommand."""
    parser = subparsers.add_parser(
        "record",
        help="record every sample of a questions file against an engine",
        description="Samples each question of QUESTIONS (JSON lines: id, prompt or messages, "
        "gold) --samples times and appends its samples to OUT: answer, tokens, finish "
        "and stop reasons, and the confidence read from --top-logprobs logprobs. Run it "
        "again to resume: only what OUT lacks is asked for. The engine: --upstream URL "
        "(any OpenAI-compatible server), --vllm-model NAME (vLLM in-process), or, with "
        "neither, the embedded llama.cpp default.",
    )
    parser.add_argument("questions", type=Path, metavar="QUESTIONS")
    parser.add_argument("out", type=Path, metavar="OUT")
    parser.add_argument("--samples", type=_positive, default=16, help="per question (16)")
    parser.add_argument("--answer-format", choices=KINDS, default="auto", help="(auto)")
    parser.add_argument("--answer-pattern", help="the regex format's pattern")
    parser.add_argument("--temperature", type=float, default=0.7, help="(0.7)")
    parser.add_argument("--top-p", type=float, help="(the engine's)")
    parser.add_argument("--max-tokens", type=_positive, default=1024, help="(1024)")
    parser.add_argument(
        "--seed",
        type=int,
        help="seed the samples: a question's from its id, moved by SEED (none: unseeded)",
    )
    parser.add_argument(
        "--top-logprobs",
        type=int,
        default=MAX_TOP_LOGPROBS,
        help=f"logprobs a token read for its confidence, 0 for none ({MAX_TOP_LOGPROBS})",
    )
    parser.add_argument(
        "--window",
        type=_positive,
        default=ConfidenceSpec.window,
        help="tokens of a confidence group, scaled down to an eighth of --max-tokens",
    )
    parser.add_argument(
        "--block",
        type=int,
        default=ConfidenceSpec.block,
        help="tokens a trajectory point sums up, 0 for none (scaled with the window)",
    )
    parser.add_argument("--completions", action="store_true", help="send prompts as completions")
    parser.add_argument("--concurrency", type=_positive, default=4, help="questions at once (4)")
    parser.add_argument("--per-request", type=_positive, help="samples a request (all)")
    parser.add_argument("--text", action="store_true", help="record each completion's text")
    parser.add_argument("--upstream", action="append", default=[], metavar="URL")
    parser.add_argument("--model", help="model name sent upstream")
    parser.add_argument("--vllm-model", help="run vLLM in-process on this model")
    parser.add_argument("--timeout", type=float, default=3600.0, help="per request, s (3600)")
    parser.set_defaults(handler=run)


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def run(args: argparse.Namespace) -> int:
    """Records; bad input is one line on stderr and exit code 2."""
    try:
        questions = read_questions(args.questions)
        confidence = None
        if args.top_logprobs:
            confidence = ConfidenceSpec(
                args.top_logprobs, args.window, args.window, max(0, args.block)
            ).scaled(args.max_tokens)
        plan = RecordPlan(
            samples=args.samples,
            answer_format=args.answer_format,
            pattern=args.answer_pattern,
            params=SamplingParams(
                temperature=args.temperature,
                top_p=args.top_p,
                max_tokens=args.max_tokens,
                seed=args.seed,
            ),
            confidence=confidence,
            chat=not args.completions,
            concurrency=args.concurrency,
            per_request=args.per_request,
            keep_text=args.text,
            timeout=args.timeout,
        )
    except ValueError as exc:
        print(f"blendserve record: error: {exc}", file=sys.stderr)
        return 2
    config = EngineConfig(
        upstreams=tuple(args.upstream), model=args.model, vllm_model=args.vllm_model
    )
    try:
        added = asyncio.run(_record(config, questions, args.out, plan))
    except ValueError as exc:
        print(f"blendserve record: error: {exc}", file=sys.stderr)
        return 2
    print(f"{args.out}: {added} samples added", file=sys.stderr)
    return 0


async def _record(
    config: EngineConfig, questions: list[Question], out: Path, plan: RecordPlan
) -> int:
    engine = await build_engine(config)
    try:
        return await record(engine, questions, out, plan, print_progress)
    finally:
        await engine.aclose()
