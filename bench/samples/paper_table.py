"""Reproduces the sample-efficiency table on recorded data and synthetic families, and times it.

Usage: python -m bench.samples.paper_table [DATA_DIR] [--reps 10] [--targets 32,64]
    [--synthetic d1,flat] [--methods sc,default]

DATA_DIR holds the recorded JSONL files (the project's shared benchmark data,
kept outside this repository for licensing). Prints a Markdown table of mean
samples per question (and improvement ratio) needed to match SC@x, the
default's ratio as a share of the best fixed policy's (every method but the
default, the oracle and plain SC; "-" when ``--methods`` leaves them out),
and the wall time of each set's table. A recording with lengths (``tokens`` on
every question's samples) adds each method's mean completion tokens per
question there (``tok``), each sample charged its question's mean recorded
tokens (:meth:`blendserve.sim.Dataset.mean_tokens`).
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

from blendserve.sim import Dataset, load_jsonl, sample_efficiency, synthetic

METHODS = [
    "sc", "esc", "asc", "asc:cap=16", "ppr", "ppr:cap=16", "blend", "oracle", "online", "default",
]  # fmt: skip
# Not policies the default competes with: the bar itself, and one that knows the answers.
_NOT_COMPARED = {"sc", "oracle", "default"}
FILES = [
    "esc_lastletters_gpt35.jsonl",
    "faithfulcot_date_codex_ltm.jsonl",
    "trove_math_codellama7b_pot.jsonl",
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("data_dir", type=Path, nargs="?", default=Path("../shared/data"))
    parser.add_argument("--reps", type=int, default=10)
    parser.add_argument("--targets", default="32,64")
    parser.add_argument("--files", default=",".join(FILES), help="recorded files ('' for none)")
    parser.add_argument("--synthetic", default="", help="synthetic families, 1,000 questions each")
    parser.add_argument("--methods", default=",".join(METHODS), help="columns (SC's bar always)")
    args = parser.parse_args()
    methods = [m for m in args.methods.split(",") if m]
    targets = [int(t) for t in args.targets.split(",")]
    jobs = min(args.reps, os.cpu_count() or 1)
    header = "| data | SC@x | SC error | " + " | ".join(methods) + " | of best | wall s |"
    print(header)
    print("|" + "---|" * (header.count("|") - 1))
    datasets = [load_jsonl(args.data_dir / name) for name in args.files.split(",") if name]
    families = [synthetic(family, 1000, seed=0) for family in args.synthetic.split(",") if family]
    for dataset in datasets + families:
        start = time.perf_counter()
        rows = sample_efficiency(dataset, targets, methods, reps=args.reps, jobs=jobs)
        wall = time.perf_counter() - start
        for row in rows:
            cells = []
            for label in methods:
                r = row.methods[label]
                tokens = "" if r.tokens is None else f", {r.tokens:.0f} tok"
                cells.append(
                    f"{r.samples:.1f} ({r.ratio:.1f}x{tokens})" + ("" if r.reached else " n/r")
                )
            compared = [r.ratio for k, r in row.methods.items() if k not in _NOT_COMPARED]
            default = row.methods.get("default")
            share = f"{default.ratio / max(compared):.0%}" if compared and default else "-"
            print(
                f"| {_name(dataset)} | {row.target} | {row.sc_error:.4f} | "
                + " | ".join(cells)
                + f" | {share} | {wall:.0f} |",
                flush=True,
            )


def _name(dataset: Dataset) -> str:
    return f"{dataset.name} ({dataset.num_questions} q)"


if __name__ == "__main__":
    main()
