"""Reproduces the sample-efficiency table on recorded data and times it.

Usage: python bench/paper_table.py [DATA_DIR] [--reps 10] [--targets 32,64]

DATA_DIR holds the recorded JSONL files (the project's shared benchmark data,
kept outside this repository for licensing). Prints a Markdown table of mean
samples per question (and improvement ratio) needed to match SC@x, and the
wall time of each file's table.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

from blendserve.sim import load_jsonl, sample_efficiency

METHODS = ["sc", "esc", "asc", "asc:cap=16", "ppr", "ppr:cap=16", "blend", "oracle", "online"]
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
    parser.add_argument("--files", default=",".join(FILES))
    args = parser.parse_args()
    targets = [int(t) for t in args.targets.split(",")]
    jobs = min(args.reps, os.cpu_count() or 1)
    header = "| data | SC@x | SC error | " + " | ".join(METHODS) + " | wall s |"
    print(header)
    print("|" + "---|" * (header.count("|") - 1))
    for name in args.files.split(","):
        dataset = load_jsonl(args.data_dir / name)
        start = time.perf_counter()
        rows = sample_efficiency(dataset, targets, METHODS, reps=args.reps, jobs=jobs)
        wall = time.perf_counter() - start
        for row in rows:
            cells = []
            for label in METHODS:
                r = row.methods[label]
                cells.append(f"{r.samples:.1f} ({r.ratio:.1f}x)" + ("" if r.reached else " n/r"))
            print(
                f"| {dataset.name} ({dataset.num_questions} q) | {row.target} | "
                f"{row.sc_error:.4f} | " + " | ".join(cells) + f" | {wall:.0f} |"
            )


if __name__ == "__main__":
    main()
