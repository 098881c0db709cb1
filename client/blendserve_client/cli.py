"""``blendserve solve``: send a JSONL file of questions, print answers as JSONL.

The same command is ``blendserve-solve`` where the client is installed alone.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, BinaryIO, Protocol, get_args

import httpx
from pydantic import ValidationError

from blendserve_client.client import Client
from blendserve_client.errors import APIError
from blendserve_client.models import Answer, Progress, SolveResult
from blendserve_client.options import AnswerKind

__all__ = ["add_arguments", "add_parser", "main", "read_questions", "run"]

DESCRIPTION = (
    "Reads one question a line ({'id', 'prompt' | 'messages'} or a JSON string; other "
    "fields, such as a recording's gold and samples, are not sent), streams the job, "
    "prints each answer as a JSON line when it settles."
)
#: The fields of a questions file's line that make a question; the rest are not sent.
QUESTION_FIELDS = ("id", "prompt", "messages")


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
    budget.add_argument("--budget-per-question", type=_finite)
    budget.add_argument(
        "--confidence", type=_finite, help="quality target instead of a budget, in (0.5, 1)"
    )
    parser.add_argument(
        "--max-samples-per-question", type=int, help="with --confidence: the cap (default 64)"
    )
    parser.add_argument("--url", default="http://127.0.0.1:8000", help="the service")
    parser.add_argument("--api-key", help="bearer key")
    parser.add_argument("--policy", help="allocation policy (default: the service's)")
    parser.add_argument("--answer", default="auto", choices=get_args(AnswerKind))
    parser.add_argument("--pattern", help="regex for --answer regex")
    parser.add_argument("--temperature", type=_finite)
    parser.add_argument("--max-tokens", type=int)
    parser.add_argument("--model")
    parser.add_argument("--settle-delta", type=_finite)
    parser.add_argument("--concurrency", type=int, help="most samples in flight")
    parser.add_argument(
        "--in-flight-per-question", type=_finite, help="samples in flight per open question"
    )
    parser.add_argument(
        "--max-rounds", type=int, help="waves per question at most (0: sample by sample)"
    )
    parser.add_argument(
        "--include-reasoning",
        action="store_true",
        help="each answer carries its completion's thought (a reasoning model's)",
    )
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.set_defaults(handler=run)


def _finite(text: str) -> float:
    """A command-line number: finite (``nan`` and ``inf`` are no budget or probability)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"not a finite number: {text!r}")
    return value


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``blendserve-solve``, the client's own console script."""
    parser = argparse.ArgumentParser(prog="blendserve-solve", description=DESCRIPTION)
    add_arguments(parser)
    return run(parser.parse_args(argv))


#: The longest line of a questions file read (a question is a request body's part).
MAX_LINE_BYTES = 16 << 20


def read_questions(path: Path) -> list[Any]:
    """Questions from JSONL, read a line at a time; raises ValueError naming the bad line."""
    if str(path) == "-":
        return _questions(sys.stdin.buffer, path)
    with path.open("rb") as stream:
        return _questions(stream, path)


def _questions(stream: BinaryIO, path: Path) -> list[Any]:
    questions = []
    for lineno in itertools.count(1):
        raw = stream.readline(MAX_LINE_BYTES + 1)
        if not raw:
            break
        if len(raw) > MAX_LINE_BYTES:
            raise ValueError(f"{path}:{lineno}: a line longer than {MAX_LINE_BYTES} bytes")
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError:
            raise ValueError(f"{path}:{lineno}: not UTF-8") from None
        if not line.strip():
            continue
        item = _parsed(line, f"{path}:{lineno}")
        if not isinstance(item, (str, dict)):
            raise ValueError(f"{path}:{lineno}: expected an object or a string")
        if not _encodable(item):
            raise ValueError(
                f"{path}:{lineno}: a lone surrogate (such as \\ud800) is not text: "
                "UTF-8 cannot encode it"
            )
        if isinstance(item, dict):
            item = {k: v for k, v in item.items() if k in QUESTION_FIELDS}
        questions.append(item)
    if not questions:
        raise ValueError(f"{path}: no questions")
    return questions


def _parsed(line: str, where: str) -> Any:
    """A line's JSON; raises ValueError naming ``where``."""
    try:
        return json.loads(line)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{where}: not valid JSON ({exc.msg})") from None
    except RecursionError:
        raise ValueError(f"{where}: JSON nested too deep") from None
    except ValueError as exc:  # a number past Python's digit limit
        raise ValueError(f"{where}: {exc}") from None


def _encodable(item: Any) -> bool:
    """Whether every string of ``item`` (keys too) is text UTF-8 can encode: no lone surrogate.

    JSON may escape half a surrogate pair (``"\\ud800"``); no request holding one can be sent.
    """
    try:
        json.dumps(item, ensure_ascii=False).encode()
    except UnicodeEncodeError:
        return False
    return True


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
                in_flight_per_question=args.in_flight_per_question, max_rounds=args.max_rounds,
                include_reasoning=args.include_reasoning or None,
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
