"""``blendserve calibrate``: the command line of :mod:`blendserve.engines.calibration.measure`.

It builds the engine as ``serve`` does, measures the grid, fits the profile and
writes it as JSON lines; an error is one line on stderr.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from blendserve.engines.base import Engine
from blendserve.engines.calibration.measure import (
    MIN_POINTS,
    CalibrationError,
    Grid,
    Point,
    _reps,
    describe,
    ignores_n,
    measure,
    summary,
    write_profile,
)
from blendserve.engines.config import Timeouts
from blendserve.engines.step_cost import StepCost
from blendserve.errors import EngineError

__all__ = ["add_parser", "run"]


def _integers(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a list of positive integers: {text!r}") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"not a list of positive integers: {text!r}")
    return values


def _tokens(text: str) -> tuple[int, int]:
    values = _integers(text)
    if len(values) != 2 or values[0] >= values[1]:
        raise argparse.ArgumentTypeError(
            f"want two increasing token counts, short and long (like 16,80), got {text!r}"
        )
    return values[0], values[1]


def _positive(kind: Callable[[str], float]) -> Callable[[str], float]:
    def parse(text: str) -> float:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
        if not value > 0:
            raise argparse.ArgumentTypeError(f"must be positive, got {text!r}")
        return value

    parse.__name__ = kind.__name__
    return parse


def add_parser(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Registers the ``calibrate`` subcommand."""
    parser = subparsers.add_parser(
        "calibrate",
        help="measure what a decode step of an engine costs, by width and context",
        description="Times requests of n samples at two lengths on one engine and writes "
        "what a decode step costs at each width (n) and context, as the JSON lines that "
        "--replay-profile FILE reads. The engine: --upstream URL (OpenAI-compatible, "
        "repeatable), --vllm-model DIR, or, with neither, the embedded llama.cpp default.",
    )
    engine = parser.add_mutually_exclusive_group()
    engine.add_argument(
        "--upstream",
        action="append",
        dest="upstreams",
        default=[],
        metavar="URL",
        help="an OpenAI-compatible server (vLLM, SGLang, llama.cpp); repeat for replicas",
    )
    engine.add_argument("--vllm-model", metavar="DIR", help="vLLM in-process on this model")
    parser.add_argument(
        "--embedded-threads",
        type=_positive(int),
        metavar="N",
        help="CPU threads of the embedded default, as serve runs it (default: half the cores)",
    )
    parser.add_argument("--model", metavar="NAME", help="model name sent upstream / served as")
    parser.add_argument("--api-key", metavar="KEY", help="bearer key for the upstreams")
    parser.add_argument("--out", type=Path, required=True, metavar="FILE", help="the profile")
    parser.add_argument(
        "--widths",
        type=_integers,
        default="1,4,16,32",
        help="sequences at once (n), comma-separated (default 1,4,16,32)",
    )
    parser.add_argument(
        "--contexts",
        type=_integers,
        default="256,1024",
        help="prompt tokens, about, comma-separated (default 256,1024)",
    )
    parser.add_argument(
        "--tokens",
        type=_tokens,
        default="16,80",
        help="max_tokens of the short and the long request (default 16,80)",
    )
    parser.add_argument(
        "--reps", type=_positive(int), default=3, help="repetitions of each point (default 3)"
    )
    parser.add_argument(
        "--timeout",
        type=_positive(float),
        default=600.0,
        help="seconds one request may take (default 600)",
    )
    parser.set_defaults(handler=run)


def _say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def _unreachable(exc: BaseException | None) -> bool:
    """Whether the error (or one it came from) is a connection nobody accepted."""
    import httpx2

    seen = 0
    while exc is not None and seen < 32:
        if isinstance(exc, httpx2.ConnectError):
            return True
        exc = exc.__cause__ or exc.__context__
        seen += 1
    return False


async def _served_model(engine: Engine) -> str | None:
    try:
        names = await asyncio.wait_for(engine.models(), 10)
    except Exception:  # the name is a label: a profile is worth writing without it
        return None
    return names[0] if names else None


async def _calibrate(args: argparse.Namespace, grid: Grid) -> tuple[list[Point], str, str | None]:
    """Builds the engine as ``serve`` does, measures the grid, closes the engine."""
    from blendserve.engines.factory import EngineConfig, build_engine
    from blendserve.engines.openai import OpenAIEngine

    config = EngineConfig(
        upstreams=tuple(args.upstreams),
        vllm_model=args.vllm_model,
        model=args.model,
        api_key=args.api_key,
        timeouts=Timeouts(call=args.timeout),
        embedded_threads=args.embedded_threads,
    )
    try:
        engine = await build_engine(config)
    except (ValueError, EngineError) as exc:
        raise CalibrationError(f"the engine cannot start: {exc}") from exc
    try:
        engine_name = describe(engine)
        model = args.model or await _served_model(engine)
        named = f"{engine_name} ({model})" if model else engine_name
        _say(
            f"calibrating {named}: widths {_listed(grid.widths)} x contexts "
            f"{_listed(grid.contexts)}, tokens {grid.tokens[0]} and {grid.tokens[1]}, "
            f"{_reps(grid.reps)}"
        )
        try:
            points = await measure(engine, grid, timeout=args.timeout, progress=_say)
        except CalibrationError as exc:
            if isinstance(engine, OpenAIEngine) and _unreachable(exc):
                urls = ", ".join(engine.urls)
                raise CalibrationError(f"nothing answers at {urls} (connection refused)") from exc
            raise
        if ignores_n(engine):
            engine_name += " (n as parallel single requests)"
        return points, engine_name, model
    finally:
        await engine.aclose()


def _listed(values: Sequence[int]) -> str:
    return ",".join(str(v) for v in values)


def run(args: argparse.Namespace) -> int:
    """Measures and writes the profile; an error is one line on stderr and exit code 1."""
    try:
        grid = Grid(args.widths, args.contexts, args.tokens, int(args.reps))
        if len(grid.widths) * len(grid.contexts) < MIN_POINTS:
            raise ValueError(
                f"{len(grid.widths)} widths x {len(grid.contexts)} contexts make "
                f"{len(grid.widths) * len(grid.contexts)} points: the fit needs {MIN_POINTS}"
            )
    except ValueError as exc:
        _say(f"blendserve calibrate: error: {exc}")
        return 2
    try:
        points, engine_name, model = asyncio.run(_calibrate(args, grid))
        if len(points) < MIN_POINTS:
            raise CalibrationError(
                f"only {len(points)} points were measured: the fit needs {MIN_POINTS}"
            )
        records = [p.record(engine=engine_name, model=model) for p in points]
        try:
            fit = StepCost.fit(records, name=args.out.name)
        except ValueError as exc:  # a point out of range: nothing worth writing
            raise CalibrationError(f"the measured points make no profile: {exc}") from exc
        try:
            write_profile(args.out, records)
        except OSError as exc:
            raise CalibrationError(f"cannot write {args.out}: {exc}") from exc
    except CalibrationError as exc:
        _say(f"blendserve calibrate: error: {exc}")
        return 1
    except KeyboardInterrupt:
        _say("blendserve calibrate: interrupted")
        return 130
    _say(f"wrote {len(records)} points to {args.out}")
    print(summary(fit, points, records))
    return 0
