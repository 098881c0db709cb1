"""Runs a named preset of the benchmarks (bench/presets.py), from the repository root.

Usage:
    python -m bench --list
    python -m bench [--dry-run] [--data DIR] NAME [ARGS...]

``NAME``'s module runs as ``python -m MODULE`` with the preset's arguments and then
``ARGS`` (passed through as given), with this Python, in the repository root; its exit
status is this one's. Presets on the recorded sets take their folder from ``--data`` or
``BLENDSERVE_BENCH_DATA``. ``--dry-run`` prints the command instead of running it.
"""

from __future__ import annotations

import argparse
import os
import shlex
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from bench.presets import BY_NAME, DATA_ENV, PRESETS, MissingData, command, describe, table

ROOT = Path(__file__).resolve().parents[1]


def build_parser() -> argparse.ArgumentParser:
    """The runner's own options, before the preset's name; what follows it passes through."""
    parser = argparse.ArgumentParser(
        prog="python -m bench",
        description="Runs a named benchmark preset (python -m bench --list shows them).",
    )
    parser.add_argument("--list", action="store_true", help="print the presets and exit")
    parser.add_argument("--dry-run", action="store_true", help="print the command, run nothing")
    parser.add_argument(
        "--data", type=Path, help=f"the recorded sets' folder (default: ${DATA_ENV})"
    )
    parser.add_argument("name", nargs="?", help="the preset")
    parser.add_argument("args", nargs=argparse.REMAINDER, help="more arguments for its module")
    return parser


def _listing() -> str:
    """The table, then each preset's command line."""
    commands = "\n".join(f"{p.name}: {describe(p)}" for p in PRESETS)
    return f"{table()}\n\n{commands}"


def main(argv: Sequence[str] | None = None) -> int:
    """Lists, prints or runs a preset; the exit status of its run."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.list:
        print(_listing())
        return 0
    if args.name is None:
        parser.error("name a preset (python -m bench --list shows them)")
    preset = BY_NAME.get(args.name)
    if preset is None:
        parser.error(f"no preset {args.name!r}; there are {', '.join(BY_NAME)}")
    data = args.data or os.environ.get(DATA_ENV) or None
    if data is not None:
        data = Path(data).resolve()
        if not args.dry_run and preset.data == "recorded" and not data.is_dir():
            parser.error(f"no folder {data} (the recorded sets)")
    try:
        words = command(preset, args.args, data)
    except MissingData as exc:
        parser.error(str(exc))
    if args.dry_run:
        print(shlex.join(words))
        return 0
    print(f"$ {shlex.join(words)}", file=sys.stderr, flush=True)
    return subprocess.run([sys.executable, *words[1:]], cwd=ROOT, check=False).returncode


if __name__ == "__main__":
    sys.exit(main())
