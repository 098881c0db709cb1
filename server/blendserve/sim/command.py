"""``blendserve simulate``: the paper's sample-efficiency table on recorded or synthetic data."""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from pathlib import Path

from blendserve.sim.data import DataError, Dataset, load_jsonl
from blendserve.sim.efficiency import (
    Curve,
    MethodResult,
    TargetResult,
    is_budget_aware,
    sample_efficiency,
    sc_scaling_exponent,
    searched_curve,
)
from blendserve.sim.synthetic import FAMILIES, synthetic

__all__ = ["add_parser", "run", "split_methods"]

DEFAULT_METHODS = "sc,esc,asc,ppr,blend,default,online,oracle"


def add_parser(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Registers the ``simulate`` subcommand."""
    parser = subparsers.add_parser(
        "simulate",
        help="measure sample efficiency of allocation policies (paper's method)",
        description="Samples each policy from the questions' true answer distributions and "
        "prints the mean samples per question each needs to match SC@x's reducible error "
        "(and, on a recording with lengths, the mean completion tokens per question spent "
        "there, each sample charged its question's mean recorded tokens).",
    )
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--data", type=Path, help="a recording (or recorded answers), one JSON "
                        "object per line")  # fmt: skip
    source.add_argument("--synthetic", choices=sorted(FAMILIES), help="a synthetic family")
    parser.add_argument("--questions", type=int, default=1000, help="synthetic set size")
    parser.add_argument("--targets", default="32", help="comma-separated x of SC@x (default 32)")
    parser.add_argument("--methods", default=DEFAULT_METHODS, help="comma-separated policies, "
                        "each with options, e.g. asc:cap=16,online:cap=4,first=0; default is "
                        "what /solve runs by default, online what /v1 runs")  # fmt: skip
    parser.add_argument("--reps", type=int, default=10, help="seeded repetitions per point")
    parser.add_argument("--seed", type=int, default=0, help="seed of the first repetition")
    parser.add_argument("--batch", type=int, default=1, help="questions selected per decision")
    parser.add_argument("--jobs", type=int, default=0, help="worker processes (0: one per core)")
    parser.add_argument("--json", type=Path, help="write the table as JSON to this file")
    parser.add_argument("--plot", type=Path, help="draw error against samples (log-log) to a PNG")
    parser.add_argument("--scaling", action="store_true", help="fit SC's power-law exponent")
    parser.set_defaults(handler=run)


def _targets(text: str) -> list[int]:
    try:
        targets = sorted({int(part) for part in text.split(",") if part.strip()})
    except ValueError:
        raise ValueError(f"--targets must be whole numbers, got {text!r}") from None
    if not targets or targets[0] < 1:
        raise ValueError("--targets must be at least 1 sample per question")
    return targets


def _load(args: argparse.Namespace) -> Dataset:
    if args.data is not None:
        return load_jsonl(args.data)
    return synthetic(args.synthetic, args.questions, args.seed)


def _format(dataset: Dataset, rows: list[TargetResult], args: argparse.Namespace) -> str:
    """The table; a tokens column (mean completion tokens per question) where the data
    records lengths."""
    lines = [
        f"{dataset.name}: {dataset.num_questions} questions ({dataset.num_dropped} dropped), "
        f"{args.reps} reps, batch {args.batch}"
    ]
    for row in rows:
        header = f"  {'method':<16}{'samples':>9}{'ratio':>9}"
        if any(r.tokens is not None for r in row.methods.values()):
            header += f"{'tokens':>10}"
        lines.append(f"SC@{row.target}: reducible error {row.sc_error:.4f}")
        lines.append(header)
        for label, result in row.methods.items():
            note = "" if result.reached else "  (not reached)"
            tokens = "" if result.tokens is None else f"{result.tokens:>10.0f}"
            lines.append(f"  {label:<16}{result.samples:>9.2f}{result.ratio:>8.2f}x{tokens}{note}")
    return "\n".join(lines)


def _to_json(rows: list[TargetResult]) -> dict[str, object]:
    """The table as JSON; each method's ``tokens`` where the data records lengths."""
    return {
        "targets": {
            str(row.target): {
                "sc_error": row.sc_error,
                "methods": {label: _method_json(r) for label, r in row.methods.items()},
            }
            for row in rows
        }
    }


def _method_json(result: MethodResult) -> dict[str, object]:
    line: dict[str, object] = {
        "samples": result.samples,
        "ratio": result.ratio,
        "reached": result.reached,
    }
    if result.tokens is not None:
        line["tokens"] = result.tokens
    return line


def _plot(path: Path, curves: dict[str, Curve], rows: list[TargetResult], title: str) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise ValueError("--plot needs matplotlib: pip install matplotlib") from None
    fig, ax = plt.subplots(figsize=(7, 5))
    for label, curve in curves.items():
        keep = (curve.errors > 0) & (curve.samples >= 1)  # after every question's first sample
        ax.plot(curve.samples[keep], curve.errors[keep], label=label, marker="." if
                len(curve.samples) < 50 else None)  # fmt: skip
    for row in rows:
        ax.axhline(row.sc_error, color="grey", linestyle=":", linewidth=0.8)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("mean samples per question")
    ax.set_ylabel("reducible error")
    ax.set_title(title)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def split_methods(text: str) -> list[str]:
    """``"asc:cap=16,window=8,blend"`` -> ``["asc:cap=16,window=8", "blend"]``.

    A comma starts a new method unless what follows is another ``key=value``
    option of the one before.
    """
    methods: list[str] = []
    for item in (part.strip() for part in text.split(",")):
        if not item:
            continue
        if methods and "=" in item and ":" not in item:
            methods[-1] += f",{item}"
        else:
            methods.append(item)
    return methods


def run(args: argparse.Namespace) -> int:
    """Runs the simulation; bad input is one line on stderr and exit code 2."""
    try:
        targets = _targets(args.targets)
        methods = split_methods(args.methods)
        if not methods:
            raise ValueError("--methods is empty")
        if args.reps < 1 or args.batch < 1 or args.questions < 1:
            raise ValueError("--reps, --batch and --questions must be at least 1")
        dataset = _load(args)
        jobs = args.jobs or min(args.reps, os.cpu_count() or 1)
        curves: dict[str, Curve] = {}
        rows = sample_efficiency(
            dataset, targets, methods, reps=args.reps, seed=args.seed, batch=args.batch,
            jobs=jobs, curves=curves,
        )  # fmt: skip
        print(_format(dataset, rows, args))
        if args.scaling:
            alpha = sc_scaling_exponent(curves["sc"])
            print(f"SC scaling: reducible error ~ x^{alpha:.3f}")
        if args.json is not None:
            args.json.write_text(json.dumps(_to_json(rows), indent=2) + "\n", encoding="utf-8")
        if args.plot is not None:
            top = max(targets)
            grid = [top * 2.0**-i for i in range(int(math.log2(top)) + 1)]
            for label in methods:
                if label.split(":")[0] != "online" and is_budget_aware(label):
                    curves[label] = searched_curve(
                        dataset, label, grid, reps=args.reps, seed=args.seed,
                        batch=args.batch, jobs=jobs,
                    )  # fmt: skip
            _plot(args.plot, curves, rows, dataset.name)
    except (DataError, ValueError, OSError) as exc:
        print(f"blendserve simulate: error: {exc}", file=sys.stderr)
        return 2
    return 0
