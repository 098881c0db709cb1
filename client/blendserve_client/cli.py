"""``blendserve solve``: send a JSONL file of questions, print answers as JSONL.

The same command is ``blendserve-solve`` where the client is installed alone.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol, get_args

import httpx
from pydantic import ValidationError

from blendserve_client.client import Client
from blendserve_client.errors import APIError
from blendserve_client.models import Answer, Progress, SolveResult
from blendserve_client.options import AnswerKind

__all__ = ["add_arguments", "add_parser", "main", "read_questions", "run"]

DESCRIPTION = (
    "Reads one question a line ({'id', 'prompt' | 'messages'} or a JSON string), streams "
    "the job, prints each answer as a JSON line when it settles."
)


def add_parser(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Registers the ``solve`` subcommand (of the service's ``blendserve`` command)."""
    parser = subparsers.add_parser(
        "solve",
        help="answer a JSONL file of questions through a running service",
        description=DESCRIPTION,
    )
    add_arguments(parser)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The command's arguments, with :func:`run` as its handler."""
    parser.add_argument("questions", type=Path, help="JSONL file, '-' for stdin")
    budget = parser.add_mutually_exclusive_group(required=True)
    budget.add_argument("--budget", type=int, help="total samples")
    budget.add_argument("--budget-per-question", type=float)
    budget.add_argument(
        "--confidence", type=float, help="quality target instead of a budget, in (0.5, 1)"
    )
    parser.add_argument(
        "--max-samples-per-question", type=int, help="with --confidence: the cap (default 64)"
    )
    parser.add_argument("--url", default="http://127.0.0.1:8000", help="the service")
    parser.add_argument("--api-key", help="bearer key")
    parser.add_argument("--policy", help="allocation policy (default: the service's)")
    parser.add_argument("--answer", default="auto", choices=get_args(AnswerKind))
    parser.add_argument("--pattern", help="regex for --answer regex")
    parser.add_argument("--temperature", type=float)
    parser.add_argument("--max-tokens", type=int)
    parser.add_argument("--model")
    parser.add_argument("--settle-delta", type=float)
    parser.add_argument("--concurrency", type=int, help="most samples in flight")
    parser.add_argument(
        "--in-flight-per-question", type=float, help="samples in flight per open question"
    )
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.set_defaults(handler=run)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``blendserve-solve``, the client's own console script."""
    parser = argparse.ArgumentParser(prog="blendserve-solve", description=DESCRIPTION)
    add_arguments(parser)
    return run(parser.parse_args(argv))


def read_questions(path: Path) -> list[Any]:
    """Questions from JSONL; raises ValueError naming the bad line."""
    text = sys.stdin.read() if str(path) == "-" else path.read_text(encoding="utf-8")
    questions = []
    for lineno, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            item = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path}:{lineno}: not valid JSON ({exc.msg})") from None
        if not isinstance(item, (str, dict)):
            raise ValueError(f"{path}:{lineno}: expected an object or a string")
        questions.append(item)
    if not questions:
        raise ValueError(f"{path}: no questions")
    return questions


class _Bar(Protocol):
    """What the command uses of a tqdm progress bar."""

    total: int
    n: int

    def write(self, text: str, file: Any = None) -> None: ...
    def set_postfix(self, **values: Any) -> None: ...
    def close(self) -> None: ...


class _NoBar:
    """Stands in for tqdm where it is off, or not installed (the client's light install)."""

    total = 0
    n = 0

    def write(self, text: str, file: Any = None) -> None:
        print(text, file=file, flush=True)

    def set_postfix(self, **values: Any) -> None:
        pass

    def close(self) -> None:
        pass


def _progress_bar(disable: bool) -> _Bar:
    if not disable:
        try:
            from tqdm import tqdm
        except ImportError:
            pass
        else:
            bar: _Bar = tqdm(total=0, unit="sample", file=sys.stderr)
            return bar
    return _NoBar()


def run(args: argparse.Namespace) -> int:
    """Streams the job; answers to stdout, progress and the summary to stderr."""
    try:
        questions = read_questions(args.questions)
    except (OSError, ValueError) as exc:
        print(f"blendserve solve: error: {exc}", file=sys.stderr)
        return 2
    sampling = {
        k: v
        for k, v in (("temperature", args.temperature), ("max_tokens", args.max_tokens))
        if v is not None
    }
    answer = {"kind": args.answer, **({"pattern": args.pattern} if args.pattern else {})}
    bar = _progress_bar(args.no_progress)
    try:
        with Client(args.url, api_key=args.api_key) as client:
            for event in client.stream(
                questions, budget=args.budget, budget_per_question=args.budget_per_question,
                confidence=args.confidence, max_samples_per_question=args.max_samples_per_question,
                policy=args.policy, answer=answer, sampling=sampling or None, model=args.model,
                settle_delta=args.settle_delta, concurrency=args.concurrency,
                in_flight_per_question=args.in_flight_per_question,
            ):  # fmt: skip
                if isinstance(event, Answer):
                    bar.write(event.model_dump_json(), file=sys.stdout)
                elif isinstance(event, Progress):
                    bar.total = event.budget
                    bar.n = event.spent
                    bar.set_postfix(answered=f"{event.answered}/{event.questions}",
                                    settled=event.settled)  # fmt: skip
                elif isinstance(event, SolveResult):
                    bar.close()
                    print(
                        f"{event.status}: {event.budget.spent}/{event.budget.total} samples, "
                        f"{event.budget.unspent} unspent, {event.duration_s:.1f} s",
                        file=sys.stderr,
                    )
                    return 0 if event.status == "completed" else 1
    except (APIError, ValidationError) as exc:  # refused by the service, or before sending
        print(f"blendserve solve: error: {exc}", file=sys.stderr)
        return 2
    except httpx.HTTPError as exc:
        print(f"blendserve solve: error: cannot reach {args.url}: {exc}", file=sys.stderr)
        return 1
    finally:
        bar.close()
    print("blendserve solve: error: the stream ended without a summary", file=sys.stderr)
    return 1
